/* Linux calls the toolchain's Glibc module does not export: epoll, pipe2, the pty calls. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>
