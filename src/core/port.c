/* port.c - the OS-specific calls of port.h: Linux names the running
 * executable /proc/self/exe, macOS asks _NSGetExecutablePath; any other
 * system, and a run under valgrind, has no re-exec (the call returns and
 * the caller runs on).
 */
#include "port.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__APPLE__)
#include <limits.h>
#include <mach-o/dyld.h>
#include <stdint.h>
#endif

/* Under valgrind (its preload libraries in LD_PRELOAD) the kernel's
 * /proc/self/exe is valgrind's tool, which refuses to be run directly, and
 * an exec of the program itself would leave valgrind unless it traces
 * children: no re-exec there. */
static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload_") != NULL;
}

void dsattn_port_reexec_self(char **argv)
{
    if (under_valgrind()) return;
#if defined(__linux__)
    execv("/proc/self/exe", argv);
#elif defined(__APPLE__)
    char path[PATH_MAX];
    uint32_t n = sizeof path;
    if (_NSGetExecutablePath(path, &n) == 0) execv(path, argv);
#else
    (void)argv;
#endif
}
