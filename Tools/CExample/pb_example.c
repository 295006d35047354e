/* The C API in use, as a POS program would: open a channel on a terminal's line, add a bridge
 * in did-open, carry data through it, close, and wait for did-close.
 *
 *   gcc -o pb_example Tools/CExample/pb_example.c -ISources/PPPBridgeC/include \
 *       -L.build/debug -lPPPBridgeC -Wl,-rpath,.build/debug -pthread
 *   ./pb_example /dev/ttyACM0 5000
 *
 * PORT is a port the terminal answers on (its echo service in the tests); the bridge listens
 * on 127.0.0.1:PORT. Exit status 0 when everything went as ICPPP says it should. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "pppbridge.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int opened, closed, close_reason = -1;
static int first_add = 99, second_add = 99;

struct settings { uint16_t port; };

static void did_open(pb_channel *channel, void *context) {
    struct settings *s = context;
    printf("did-open: ip %s submask %s dns %s terminal %s\n",
           pb_ip(channel), pb_submask(channel), pb_dns(channel), pb_terminal_ip(channel));
    /* As in ICPPP: a bridge added here accepts connections at once. */
    int a = pb_add_host_to_terminal_bridge_local(channel, s->port);
    int b = pb_add_host_to_terminal_bridge_local(channel, s->port);
    printf("bridge local:%u added: %d, again: %d\n", s->port, a, b);
    fflush(stdout);
    pthread_mutex_lock(&lock);
    first_add = a;
    second_add = b;
    opened = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void did_close(pb_channel *channel, int reason, void *context) {
    (void)channel;
    (void)context;
    printf("did-close: reason %d%s\n", reason, reason == PB_CLOSED_BY_US ? " (closed by us)" : "");
    fflush(stdout);
    pthread_mutex_lock(&lock);
    close_reason = reason;
    closed = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

/* Waits up to `seconds` for *flag. */
static int wait_for(int *flag, int seconds) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&lock);
    while (!*flag) {
        if (pthread_cond_timedwait(&changed, &lock, &until) != 0) break;
    }
    int result = *flag;
    pthread_mutex_unlock(&lock);
    return result;
}

static int echo_through(uint16_t port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {10, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        close(s);
        return 0;
    }
    char message[4096];
    for (size_t i = 0; i < sizeof message; i++) message[i] = (char)('a' + i % 26);
    if (send(s, message, sizeof message, 0) != (ssize_t)sizeof message) {
        perror("send");
        close(s);
        return 0;
    }
    char back[sizeof message];
    size_t got = 0;
    while (got < sizeof back) {
        ssize_t n = recv(s, back + got, sizeof back - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(s);
    int same = got == sizeof message && memcmp(message, back, sizeof message) == 0;
    printf("echo through the bridge: %zu of %zu bytes back, %s\n", got, sizeof message, same ? "equal" : "DIFFERENT");
    return same;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEVICE PORT\n", argv[0]);
        return 2;
    }
    struct settings s = { (uint16_t)atoi(argv[2]) };
    pb_channel *channel = pb_channel_create(argv[1], &s, did_open, did_close);
    if (!channel) {
        fprintf(stderr, "pb_channel_create failed\n");
        return 1;
    }
    int r = pb_open_channel(channel);
    printf("pb_open_channel: %d\n", r);
    if (r != 0 || !wait_for(&opened, 30)) {
        fprintf(stderr, "the channel did not open\n");
        pb_channel_destroy(channel);
        return 1;
    }
    int ok = first_add == PB_OK && second_add == PB_BRIDGE_EXISTS;
    ok = echo_through(s.port) && ok;
    int removed = pb_remove_bridge(channel, PB_BRIDGE_HOST_TO_TERMINAL_LOCAL, s.port);
    int removed_again = pb_remove_bridge(channel, PB_BRIDGE_HOST_TO_TERMINAL_LOCAL, s.port);
    printf("remove bridge: %d, again: %d\n", removed, removed_again);
    ok = ok && removed == PB_OK && removed_again == PB_NO_SUCH_BRIDGE;
    pb_close_channel(channel);
    if (!wait_for(&closed, 15)) {
        fprintf(stderr, "did-close did not come\n");
        ok = 0;
    }
    ok = ok && close_reason == PB_CLOSED_BY_US && pb_ip(channel)[0] == 0;
    pb_channel_destroy(channel);
    printf("%s\n", ok ? "pb_example: ok" : "pb_example: FAILED");
    return ok ? 0 : 1;
}
