/* Linux calls the toolchain's Glibc module does not export: epoll, pipe2 and the pty calls.
   The prototypes are declared here rather than unlocked with _GNU_SOURCE, which would change
   the system headers' types under other modules that include them too (fd_set in libpcap's). */
#include <stddef.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

int pipe2(int pipefd[2], int flags);
int posix_openpt(int flags);
int grantpt(int fd);
int unlockpt(int fd);
int ptsname_r(int fd, char *buf, size_t buflen);
