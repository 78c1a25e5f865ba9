/* port.c - the OS-specific calls of port.h: Linux names the running
 * executable /proc/self/exe, macOS asks _NSGetExecutablePath; any other
 * system has no re-exec (the call returns and the caller runs on).
 */
#include "port.h"

#include <unistd.h>

#if defined(__APPLE__)
#include <limits.h>
#include <mach-o/dyld.h>
#include <stdint.h>
#endif

void dsattn_port_reexec_self(char **argv)
{
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
