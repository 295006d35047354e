/* The service through the C API, as a POS program with many terminals would run it: open a
 * configuration directory, hear the events, list the terminals, add and remove a bridge, close.
 *
 *   gcc -o pb_service_example Tools/CExample/pb_service_example.c -ISources/PPPBridgeC/include \
 *       -L.build/debug -lPPPBridgeC -Wl,-rpath,.build/debug -pthread
 *   ./pb_service_example DIR TERMINAL PORT
 *
 * DIR holds TERMINAL.conf; the program waits (up to 30 s) for that terminal's "opened" event,
 * adds the bridge local:PORT, checks the codes of a second add and of a terminal that does not
 * exist, removes the bridge and closes. Exit status 0 when every answer was as the header says. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pppbridge.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int opened, events;
static const char *wanted;

static void on_event(pb_service *service, const char *event, void *context) {
    (void)service;
    (void)context;
    printf("event: %s\n", event);
    pthread_mutex_lock(&lock);
    events++;
    char needle[128];
    snprintf(needle, sizeof needle, "\"terminal\":\"%s\"", wanted);
    if (strstr(event, "\"event\":\"opened\"") && strstr(event, needle)) opened = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static int failures;

static void expect(int ok, const char *what) {
    printf("%s: %s\n", what, ok ? "as expected" : "NOT as expected");
    if (!ok) failures++;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: pb_service_example DIR TERMINAL PORT\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    wanted = argv[2];
    pb_service *service = pb_service_open(argv[1], on_event, NULL);
    if (service == NULL) {
        perror("pb_service_open");
        return 1;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&lock);
    while (!opened && pthread_cond_timedwait(&changed, &lock, &until) == 0) {}
    int up = opened;
    pthread_mutex_unlock(&lock);
    expect(up, "the terminal's link opened");

    char reply[4096];
    int code = pb_service_request(service, "{\"cmd\":\"list\"}", reply, sizeof reply);
    printf("list: %d %s\n", code, reply);
    expect(code == PB_OK && strstr(reply, "\"state\":\"open\"") != NULL, "list shows it open");

    char bridge[32];
    snprintf(bridge, sizeof bridge, "local:%s", argv[3]);
    expect(pb_service_add_bridge(service, argv[2], bridge) == PB_OK, "add bridge");
    expect(pb_service_add_bridge(service, argv[2], bridge) == PB_BRIDGE_EXISTS, "add it again: PB_BRIDGE_EXISTS");
    expect(pb_service_add_bridge(service, "nobody", bridge) == PB_NO_SUCH_TERMINAL, "a terminal that is not there: PB_NO_SUCH_TERMINAL");
    expect(pb_service_add_bridge(service, argv[2], "local:+1") == PB_INVALID, "a bridge that is not one: PB_INVALID");
    expect(pb_service_request(service, "{\"cmd\":\"frobnicate\"}", reply, sizeof reply) == PB_BAD_REQUEST, "an unknown request: PB_BAD_REQUEST");
    expect(pb_service_request(service, "not json", NULL, 0) == PB_BAD_REQUEST, "not JSON: PB_BAD_REQUEST");
    expect(pb_service_request(service, "{\"cmd\":\"list\"}", reply, 8) == PB_OK && strlen(reply) == 7, "a short buffer: the reply cut, NUL-terminated");
    expect(pb_service_remove_bridge(service, argv[2], bridge) == PB_OK, "remove bridge");
    expect(pb_service_remove_bridge(service, argv[2], bridge) == PB_NO_SUCH_BRIDGE, "remove it again: PB_NO_SUCH_BRIDGE");

    expect(pb_service_close(service) == PB_OK, "close");
    expect(pb_service_close(service) == PB_INVALID, "close again: PB_INVALID");
    expect(pb_service_request(service, "{\"cmd\":\"list\"}", reply, sizeof reply) == PB_INVALID, "a request after close: PB_INVALID");
    pthread_mutex_lock(&lock);
    int seen = events;
    pthread_mutex_unlock(&lock);
    printf("events: %d\n", seen);
    printf("pb_service_example: %s\n", failures == 0 ? "ok" : "FAILED");
    return failures == 0 ? 0 : 1;
}
