/* port.h - the operating-system calls dsattn needs that are not ISO C or
 * POSIX, behind one small interface with a fallback (port.c).  The CPU
 * probes (cpuid, AT_HWCAP) are in cpu.c. */
#ifndef DSATTN_PORT_H
#define DSATTN_PORT_H

/* Replace the running process with a fresh run of its own executable and
 * `argv` (the environment as it is now).  Returns only on failure, where
 * the OS gives no way to name the running executable, or under valgrind
 * (port.c): the caller then runs on. */
void dsattn_port_reexec_self(char **argv);

#endif /* DSATTN_PORT_H */
