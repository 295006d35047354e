/* pppbridge's C API: the ICPPP channel (a PPP link to a payment terminal on a serial line, our
 * own TCP/IP stack on it, bridges both ways, a SOCKS proxy and a DNS relay) for programs in any
 * language that can call C. It mirrors the vendor's ICPPP.h: open, did-open with the four
 * addresses, bridges with the header's return codes, keep-alive, close, did-close.
 *
 * Link with -lPPPBridgeC. Every channel runs on the library's event loop, one thread for all
 * channels. Callbacks run on that thread: keep them short, and call the pb_ functions from
 * them freely (a bridge added in did-open accepts connections at once, as in ICPPP) except
 * pb_channel_destroy. Every other function may be called from any thread.
 *
 * The library never ends or hangs its host program: a resource it cannot get (descriptors,
 * memory for a thread) is an error returned, never a trap, and a handle is checked on every
 * call. A pb_channel * is a number the library hands out once and never again: a call with a
 * handle that was destroyed, or never created, returns PB_INVALID (or "" for the address
 * functions) and touches nothing. */
#ifndef PPPBRIDGE_H
#define PPPBRIDGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pb_channel pb_channel;

typedef void (*pb_did_open_fn)(pb_channel *channel, void *context);
typedef void (*pb_did_close_fn)(pb_channel *channel, int reason, void *context);

/* Why a channel closed (did-close's reason): pppd's exit statuses for the same causes. */
#define PB_CLOSED_BY_US             0   /* pb_close_channel */
#define PB_CLOSED_LINE_FAILED       7   /* the device could not be opened or failed */
#define PB_CLOSED_NEGOTIATION       10  /* LCP or IPCP did not agree */
#define PB_CLOSED_AUTHENTICATION    11  /* PAP or CHAP failed */
#define PB_CLOSED_ECHO_TIMEOUT      15  /* no answer to LCP echo requests */
#define PB_CLOSED_HANG_UP           16  /* the line hung up (a cable pulled, a USB unplug) */
#define PB_CLOSED_LOOPBACK          17  /* the line is looped back */
#define PB_CLOSED_PEER_TERMINATED   22  /* the terminal ended the link */

/* What the bridge functions return (ICPPP's codes). */
#define PB_OK                        0
#define PB_NO_MORE_BRIDGES          -1  /* at most 12 */
#define PB_BRIDGE_EXISTS            -2
#define PB_BRIDGE_NOT_STARTED       -3  /* the channel is not open */
#define PB_BRIDGE_INIT_FAILED       -4  /* the port could not be listened on */
#define PB_NO_SUCH_BRIDGE           -5  /* pb_remove_bridge: none of that kind on that port */
#define PB_INVALID                  -6  /* a NULL, destroyed or unknown channel, a port of 0,
                                           an unknown kind, keep-alive values out of range */
#define PB_OPEN_FAILED              -7  /* pb_open_channel: the device could not be opened */

/* pb_remove_bridge's kinds. */
#define PB_BRIDGE_HOST_TO_TERMINAL        0  /* listening on every host interface */
#define PB_BRIDGE_HOST_TO_TERMINAL_LOCAL  1  /* listening on 127.0.0.1 only */
#define PB_BRIDGE_TERMINAL_TO_HOST        2  /* listening on our PPP address */

/* A channel on `device` (a serial device or a pty; a symbolic link is followed at each open;
 * or a serial line on a device server: "tcp:HOST:PORT" raw, "rfc2217:HOST:PORT" with the port
 * set to 115200 8N1 over RFC 2217, HOST numeric or localhost) in the host role: we are 192.168.53.1, the terminal 192.168.53.2, with the SOCKS proxy on
 * port 1080 and the DNS relay. Nothing is opened yet. The first call starts the library's
 * event loop. NULL with errno set when it cannot: EINVAL (`device` NULL or empty), EMFILE or
 * ENFILE (no descriptors for the loop), EAGAIN (no thread for it); a later call tries again. */
pb_channel *pb_channel_create(const char *device, void *context,
                              pb_did_open_fn did_open, pb_did_close_fn did_close);

/* Starts opening the link and returns at once; did-open follows when IP runs on it, or
 * did-close when it fails. 0: opening; PB_INVALID; PB_OPEN_FAILED when the device could not
 * be opened (did-close has then been called with PB_CLOSED_LINE_FAILED). Called from
 * did-close (to reconnect), the open starts on a later turn of the loop and returns 0: at
 * once when the link that closed had been open, a second later when it never came up (a
 * missing device fails again at once: reopening it from did-close is retried once a second,
 * never in a busy loop); a failure is then a did-close of its own. */
int  pb_open_channel(pb_channel *channel);
/* Closes the link (LCP Terminate-Request) and returns at once (0, or PB_INVALID); did-close
 * follows. */
int  pb_close_channel(pb_channel *channel);

int  pb_add_host_to_terminal_bridge(pb_channel *channel, uint16_t port);
int  pb_add_host_to_terminal_bridge_local(pb_channel *channel, uint16_t port);
int  pb_add_terminal_to_host_bridge(pb_channel *channel, uint16_t port);
int  pb_remove_bridge(pb_channel *channel, int kind, uint16_t port);

/* TCP keep-alive for the terminal's connections through the proxy: idle seconds before the
 * first probe, seconds between probes, unanswered probes. 0, or PB_INVALID for values the
 * kernel does not take (0, or beyond 32767 / 32767 / 127), which change nothing. */
int  pb_set_keepalive(pb_channel *channel, unsigned idle_s, unsigned interval_s, unsigned count);

/* Dotted quads, valid from did-open until did-close is called; "" while closed. */
const char *pb_ip(pb_channel *channel);
const char *pb_submask(pb_channel *channel);
const char *pb_dns(pb_channel *channel);
const char *pb_terminal_ip(pb_channel *channel);

/* Every connection through the channel's bridges and proxy, as one JSON object (ICNetwork's
 * per-connection calls): {"event":"connection-opened"|"connection-closed"|"connection-refused",
 * "connection":N (its opened and closed share it; 0 for a refusal), "bridge":"host:5000" or
 * "proxy":true, "destination" (the terminal's port, the host's, or what the terminal asked
 * the proxy for: a name as asked, with the address it led to), "source", "failure" (why it
 * was refused or failed), and when closed "bytes_to_terminal" and "bytes_to_host"}. Called on
 * the loop's thread with create's context; the text is valid during the call only. NULL
 * stops it. 0, or PB_INVALID. */
typedef void (*pb_connection_fn)(pb_channel *channel, const char *event_json, void *context);
int  pb_set_connection_callback(pb_channel *channel, pb_connection_fn fn);

/* Closes the link without a word to the terminal if it is up and frees the channel; no
 * callback runs after it returns. 0, or PB_INVALID for a handle already destroyed (a second
 * destroy is harmless) or never created, and when called from a callback (nothing is done:
 * a channel is not freed in the middle of its own work). */
int  pb_channel_destroy(pb_channel *channel);

/* ---- The service: many terminals from a configuration directory ----
 *
 * What `pppbridge serve` runs, for a program that runs it itself: one NAME.conf per terminal
 * in `directory` (the format of `pppbridge serve --help` and docs/SERVICE.md), files followed
 * as they come and go, devices as they appear, each link kept up with pppd's persist, holdoff
 * and maxfail. On the same event loop as the channels. Opening it raises the process's soft
 * descriptor limit to the hard one and divides the descriptors as serve does. */
typedef struct pb_service pb_service;

/* An event as one JSON object (the control socket's event lines: "opened", "closed",
 * "waiting", "gave-up", "connection-opened", "terminal-added", "configuration-error", ...).
 * Called on the loop's thread; the text is valid during the call only. */
typedef void (*pb_service_event_fn)(pb_service *service, const char *event_json, void *context);

/* Opens `directory` and starts its terminals. NULL with errno set when it cannot: EINVAL
 * (`directory` NULL or empty), ENOENT or another error of watching it, EMFILE (no
 * descriptors for the loop). `on_event` may be NULL. */
pb_service *pb_service_open(const char *directory, pb_service_event_fn on_event, void *context);

/* One request as the control socket takes it (`{"cmd":"list"}`, `{"cmd":"status",
 * "terminal":"t1"}`, `{"cmd":"add-bridge","terminal":"t1","bridge":"host:5000"}`, ...). The
 * reply, one JSON object, is written to `reply` (NUL-terminated, cut at `size` - 1 bytes) when
 * `reply` is not NULL. Returns 0 when the reply says ok, else its code: ICPPP's -1 to -4 for a
 * bridge, PB_NO_SUCH_BRIDGE, PB_NO_SUCH_TERMINAL, PB_BAD_REQUEST; PB_INVALID for a handle that
 * is not a live service. */
int pb_service_request(pb_service *service, const char *request_json, char *reply, size_t size);

/* pb_service_*'s codes beyond the channel's (the control socket's JSON says -6 and -7 for
 * these; here they are kept apart from PB_INVALID and PB_OPEN_FAILED). */
#define PB_NO_SUCH_TERMINAL         -8  /* no terminal of that name */
#define PB_BAD_REQUEST              -9  /* not a request the service takes */

/* A bridge on a terminal now and whenever its link opens again (`bridge` is host:PORT,
 * local:PORT or terminal:PORT), or removed: what pb_service_request returns for add-bridge
 * and remove-bridge. */
int pb_service_add_bridge(pb_service *service, const char *terminal, const char *bridge);
int pb_service_remove_bridge(pb_service *service, const char *terminal, const char *bridge);

/* Closes every link (LCP Terminate-Request, at most 5 s) and frees the service; no event
 * callback runs after it returns. 0, or PB_INVALID for a handle already closed or never
 * opened, and when called from an event callback (nothing is done: it would wait for the
 * thread it runs on). */
int pb_service_close(pb_service *service);

#ifdef __cplusplus
}
#endif

#endif
