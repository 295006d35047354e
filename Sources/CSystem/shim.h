/* Linux calls the toolchain's Glibc module does not export: epoll, pipe2 and the pty calls.
   The prototypes are declared here rather than unlocked with _GNU_SOURCE, which would change
   the system headers' types under other modules that include them too (fd_set in libpcap's). */
#include <stddef.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <unistd.h>

int pipe2(int pipefd[2], int flags);
int posix_openpt(int flags);
int grantpt(int fd);
int unlockpt(int fd);
int ptsname_r(int fd, char *buf, size_t buflen);
/* glibc: gives the heap's free pages back to the kernel (a service after its load went). */
int malloc_trim(size_t pad);

/* TUN devices and interface addresses (what pppd's sys-linux.c does with ioctls), kept in C
   because struct ifreq is a union Swift cannot fill conveniently. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <net/if.h>
#include <netinet/in.h>

#define PPPBRIDGE_TUNSETIFF 0x400454caUL
#define PPPBRIDGE_IFF_TUN 0x0001
#define PPPBRIDGE_IFF_NO_PI 0x1000

/* Opens /dev/net/tun as the TUN interface `name` (packets without the 4-byte PI header);
   the kernel's name for it goes to `actual` (IFNAMSIZ bytes). */
static inline int pppbridge_tun_open(const char *name, char *actual) {
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = PPPBRIDGE_IFF_TUN | PPPBRIDGE_IFF_NO_PI;
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (ioctl(fd, PPPBRIDGE_TUNSETIFF, &ifr) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    memcpy(actual, ifr.ifr_name, IFNAMSIZ);
    return fd;
}

/* Gives interface `name` its point-to-point addresses (network byte order), MTU, and brings it up. */
static inline int pppbridge_if_configure(const char *name, uint32_t local, uint32_t peer, int mtu) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct ifreq ifr;
    struct sockaddr_in sin;
    int rc = 0;
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;

    memset(&ifr, 0, sizeof ifr);
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    sin.sin_addr.s_addr = local;
    memcpy(&ifr.ifr_addr, &sin, sizeof sin);
    if (ioctl(s, SIOCSIFADDR, &ifr) < 0) rc = -1;

    sin.sin_addr.s_addr = peer;
    memcpy(&ifr.ifr_dstaddr, &sin, sizeof sin);
    if (rc == 0 && ioctl(s, SIOCSIFDSTADDR, &ifr) < 0) rc = -1;

    sin.sin_addr.s_addr = 0xFFFFFFFFu;
    memcpy(&ifr.ifr_netmask, &sin, sizeof sin);
    if (rc == 0 && ioctl(s, SIOCSIFNETMASK, &ifr) < 0) rc = -1;

    ifr.ifr_mtu = mtu;
    if (rc == 0 && ioctl(s, SIOCSIFMTU, &ifr) < 0) rc = -1;

    if (rc == 0 && ioctl(s, SIOCGIFFLAGS, &ifr) < 0) rc = -1;
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING | IFF_POINTOPOINT;
    if (rc == 0 && ioctl(s, SIOCSIFFLAGS, &ifr) < 0) rc = -1;

    int e = errno;
    close(s);
    errno = e;
    return rc;
}

/* Host sockets: accept4 is a GNU extension the Glibc module leaves out. */
struct sockaddr;
int accept4(int sockfd, struct sockaddr *addr, socklen_t *addrlen, int flags);

/* open(2)'s O_PATH (Linux: a descriptor that names a file without opening it for I/O). */
#define PPPBRIDGE_O_PATH 010000000

/* The user ID of the process at the other end of a Unix socket (SO_PEERCRED); struct ucred
   itself needs _GNU_SOURCE, so its layout (pid, uid, gid) is spelled out here. -1 on error. */
static inline int pppbridge_peer_uid(int fd, unsigned int *uid) {
    struct { int pid; unsigned int uid; unsigned int gid; } cred;
    socklen_t length = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) < 0) return -1;
    *uid = cred.uid;
    return 0;
}
