/* The C API with a careless or unlucky host program: handles used after pb_channel_destroy,
 * destroyed twice, or never created; a did-close handler that reopens a missing device; and,
 * under a descriptor limit too low for the library's loop, a create that fails. None of it may
 * trap or hang the program: each call returns an error and the program goes on.
 *
 *   gcc -o pb_handles Tools/CExample/pb_handles.c -ISources/PPPBridgeC/include \
 *       -L.build/debug -lPPPBridgeC -Wl,-rpath,.build/debug -pthread
 *   ./pb_handles                        # prints "pb_handles: ok"
 *   prlimit --nofile=5:5 ./pb_handles   # prints "pb_handles: create failed cleanly: ..."
 *
 * Exit status 0 when every call answered as the header says. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pppbridge.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int closes;

static void did_close(pb_channel *channel, int reason, void *context) {
    (void)reason;
    (void)context;
    pthread_mutex_lock(&lock);
    closes++;
    pthread_mutex_unlock(&lock);
    /* A program that keeps trying: the library holds the retries of a link that never came up
     * a second apart. */
    pb_open_channel(channel);
}

static int failures;

static void expect(int ok, const char *what) {
    printf("%s: %s\n", what, ok ? "as expected" : "NOT as expected");
    if (!ok) failures++;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    errno = 0;
    pb_channel *channel = pb_channel_create("/nonexistent/pb_handles-line", NULL, NULL, did_close);
    if (channel == NULL) {
        int e = errno;
        printf("pb_handles: create failed cleanly: errno %d (%s)\n", e, strerror(e));
        return e != 0 ? 0 : 1;
    }
    expect(pb_channel_create(NULL, NULL, NULL, NULL) == NULL && errno == EINVAL, "create with no device: NULL, EINVAL");

    /* A missing device, reopened from did-close for three seconds. */
    int opened = pb_open_channel(channel);
    printf("pb_open_channel on a missing device: %d\n", opened);
    sleep(3);
    pthread_mutex_lock(&lock);
    int seen = closes;
    pthread_mutex_unlock(&lock);
    printf("did-close calls in 3 s of reopening from did-close: %d\n", seen);
    expect(seen >= 1 && seen <= 6, "reopens a second apart, not a busy loop");

    expect(pb_set_keepalive(channel, 0, 1, 1) == PB_INVALID, "keep-alive of 0 s refused");
    expect(pb_set_keepalive(channel, 60, 10, 5) == PB_OK, "keep-alive 60,10,5 taken");

    expect(pb_channel_destroy(channel) == PB_OK, "destroy");
    expect(pb_channel_destroy(channel) == PB_INVALID, "destroy again: PB_INVALID");
    expect(pb_open_channel(channel) == PB_INVALID, "open after destroy: PB_INVALID");
    expect(pb_close_channel(channel) == PB_INVALID, "close after destroy: PB_INVALID");
    expect(pb_add_host_to_terminal_bridge(channel, 5000) == PB_INVALID, "add bridge after destroy: PB_INVALID");
    expect(pb_remove_bridge(channel, PB_BRIDGE_HOST_TO_TERMINAL, 5000) == PB_INVALID, "remove bridge after destroy: PB_INVALID");
    expect(pb_set_keepalive(channel, 60, 10, 5) == PB_INVALID, "keep-alive after destroy: PB_INVALID");
    expect(strcmp(pb_ip(channel), "") == 0 && strcmp(pb_terminal_ip(channel), "") == 0, "addresses after destroy: empty");

    pb_channel *made_up = (pb_channel *)(uintptr_t)0x1230;
    expect(pb_open_channel(made_up) == PB_INVALID, "a handle never created: PB_INVALID");
    expect(pb_channel_destroy(made_up) == PB_INVALID, "destroying it: PB_INVALID");
    expect(pb_open_channel(NULL) == PB_INVALID, "NULL: PB_INVALID");

    /* The handle just destroyed is never handed out again. */
    pb_channel *next = pb_channel_create("/nonexistent/pb_handles-other", NULL, NULL, NULL);
    expect(next != NULL && next != channel, "a new channel gets a new handle");
    expect(pb_open_channel(channel) == PB_INVALID, "the old handle stays invalid");
    expect(pb_channel_destroy(next) == PB_OK, "destroy the new one");

    printf("pb_handles: %s\n", failures == 0 ? "ok" : "FAILED");
    return failures == 0 ? 0 : 1;
}
