/* libmicrohttpd glue: listening, body collection, auth and size checks, routing,
 * sending, the per-request log line. */
#include "http.h"

#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "mhderr.h"
#include "policy.h"
#include "request.h"
#include "response.h"

double dray_srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dray_srv_log(const char *method, const char *path, int status, uint32_t n_prompt,
                  uint32_t n_cached, uint32_t n_completion, double ms, int replica)
{
    char rep[24] = "";
    if (replica >= 0)
        snprintf(rep, sizeof(rep), " replica=%d", replica);
    /* one fprintf per line: stdio locks the stream, so lines of concurrent
     * requests do not interleave */
    fprintf(stderr, "dray serve: %s %s %d prompt=%u cached=%u completion=%u ms=%.1f%s\n", method, path,
            status, n_prompt, n_cached, n_completion, ms, rep);
}

void dray_srv_add_replica_header(struct MHD_Response *r, int replica)
{
    char v[16];
    if (replica < 0)
        return;
    snprintf(v, sizeof(v), "%d", replica);
    MHD_add_response_header(r, "X-Dray-Replica", v);
}

enum MHD_Result dray_srv_send(struct dray_srv_call *c, int status, const char *content_type,
                              char *body, size_t len, unsigned retry_after)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"",
                                                             body ? MHD_RESPMEM_MUST_FREE
                                                                  : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (retry_after) {
        char v[16];
        snprintf(v, sizeof(v), "%u", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (c->allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, c->allow);
    dray_srv_add_replica_header(r, c->replica);
    enum MHD_Result ok = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    c->status = status;
    dray_srv_metrics_count_status(&c->srv->metrics, status);
    return ok;
}

enum MHD_Result dray_srv_send_error(struct dray_srv_call *c, const struct dray_srv_error *e)
{
    char *body = dray_srv_error_json(e);
    unsigned retry = e->status == 429 || e->status == 503 ? 1 : 0;
    return dray_srv_send(c, e->status, "application/json", body, body ? strlen(body) : 0, retry);
}

bool dray_srv_client_gone(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
        return true;
    char byte;
    /* readable: either the next pipelined request (still there) or end of stream */
    return recv(ci->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* ------------------------------------------------------------ in-flight list */

void dray_srv_flight_add(struct dray_srv *s, struct dray_srv_flight *f)
{
    pthread_mutex_lock(&s->mu);
    f->prev = NULL;
    f->next = s->flights;
    if (s->flights)
        s->flights->prev = f;
    s->flights = f;
    s->n_flight++;
    pthread_mutex_unlock(&s->mu);
}

void dray_srv_flight_remove(struct dray_srv *s, struct dray_srv_flight *f)
{
    pthread_mutex_lock(&s->mu);
    if (f->prev)
        f->prev->next = f->next;
    else
        s->flights = f->next;
    if (f->next)
        f->next->prev = f->prev;
    s->n_flight--;
    pthread_mutex_unlock(&s->mu);
}

unsigned dray_srv_in_flight(struct dray_srv *s)
{
    pthread_mutex_lock(&s->mu);
    unsigned n = s->n_flight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void dray_srv_cancel_all(struct dray_srv *s)
{
    pthread_mutex_lock(&s->mu);
    for (struct dray_srv_flight *f = s->flights; f; f = f->next)
        dray_request_cancel(f->req);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------ routes */

static enum MHD_Result send_json(struct dray_srv_call *c, int status, char *json)
{
    if (!json) {
        struct dray_srv_error e;
        dray_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return dray_srv_send_error(c, &e);
    }
    return dray_srv_send(c, status, "application/json", json, strlen(json), 0);
}

static enum MHD_Result get_metrics(struct dray_srv_call *c, int kind)
{
    (void)kind;
    struct dray_srv *s = c->srv;
    struct dray_sched_stats *st = calloc(s->n_rep, sizeof(*st));
    struct dray_srv_metrics **rep = calloc(s->n_rep, sizeof(*rep));
    struct dray_srv_buf b = {0};
    int rc = st && rep ? 0 : DRAY_ENOMEM;
    for (uint32_t i = 0; !rc && i < s->n_rep; i++) {
        dray_sched_get_stats(s->rep[i].sched, &st[i]);
        rep[i] = &s->rep[i].metrics;
    }
    if (!rc)
        rc = dray_srv_metrics_format(&s->metrics, rep, st, s->n_rep, &b);
    free(st);
    free(rep);
    if (rc) {
        dray_srv_buf_free(&b);
        return send_json(c, 500, NULL);
    }
    return dray_srv_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, 0);
}

/* {"status":"ok","replicas":[{"replica":0,"device":"...","running":1,"waiting":0},...]}:
 * 200 while serving, 503 once draining (a load balancer then stops sending) or
 * once a replica lost a rank of its model ("failed", with the replica's error). */
static enum MHD_Result get_health(struct dray_srv_call *c, int kind)
{
    (void)kind;
    struct dray_srv *s = c->srv;
    bool draining = atomic_load(&s->draining), failed = false;
    json_t *reps = json_array();
    for (uint32_t i = 0; reps && i < s->n_rep; i++) {
        struct dray_sched_stats st;
        struct dray_split_report sr;
        const struct dray_engine_info *in = dray_engine_get_info(s->rep[i].engine);
        dray_sched_get_stats(s->rep[i].sched, &st);
        dray_engine_split_report(s->rep[i].engine, &sr);
        json_t *rep = json_pack("{s:I,s:s,s:s,s:I,s:I}", "replica", (json_int_t)i, "plugin",
                                in->plugin ? in->plugin : "", "device", in->device ? in->device : "",
                                "running", (json_int_t)st.running, "waiting", (json_int_t)st.waiting);
        if (rep && sr.lost[0]) {
            json_object_set_new(rep, "error", json_string(sr.lost));
            failed = true;
        }
        json_array_append_new(reps, rep);
    }
    json_t *root = json_pack("{s:s,s:o}", "status", failed ? "failed" : draining ? "draining" : "ok", "replicas",
                             reps);
    char *body = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return send_json(c, draining || failed ? 503 : 200, body);
}

static enum MHD_Result get_models(struct dray_srv_call *c, int kind)
{
    (void)kind;
    return send_json(c, 200, dray_srv_models_json(&c->srv->models));
}

/* GET /v1/models/{id}: what the openai package's models.retrieve asks */
static enum MHD_Result get_model(struct dray_srv_call *c, int kind)
{
    (void)kind;
    struct dray_srv_error e;
    char *body = dray_srv_model_json(&c->srv->models, c->path + strlen("/v1/models/"), &e);
    return body ? send_json(c, 200, body) : dray_srv_send_error(c, &e);
}

static const struct route {
    const char *path, *method;
    bool prefix; /* path is the start of the URL: the rest is an id */
    enum MHD_Result (*serve)(struct dray_srv_call *c, int kind);
    int kind;    /* an enum dray_srv_kind for the endpoints with a JSON body */
} routes[] = {
    {"/v1/chat/completions", "POST", false, dray_srv_generate, DRAY_SRV_CHAT},
    {"/v1/completions", "POST", false, dray_srv_generate, DRAY_SRV_COMPLETION},
    {"/tokenize", "POST", false, dray_srv_tokenize, DRAY_SRV_TOKENIZE},
    {"/detokenize", "POST", false, dray_srv_tokenize, DRAY_SRV_DETOKENIZE},
    {"/v1/models", "GET", false, get_models, 0},
    {"/v1/models/", "GET", true, get_model, 0},
    {"/health", "GET", false, get_health, 0},
    {"/metrics", "GET", false, get_metrics, 0},
};

/* RFC 9110's methods: another one is not implemented (501), one of these on a
 * path that takes another is not allowed there (405). */
static bool known_method(const char *m)
{
    static const char *const known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS",
                                        "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (!strcmp(m, known[i]))
            return true;
    return false;
}

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                           : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* While dray answers (a whole request may wait in the queue, a stream between
 * tokens) the connection may be idle longer than the header timeout. */
#define ANSWER_TIMEOUT 120u

static enum MHD_Result route(struct dray_srv_call *c)
{
    struct dray_srv_error e;
    MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT,
                              c->srv->cfg->header_timeout > ANSWER_TIMEOUT ? c->srv->cfg->header_timeout
                                                                           : ANSWER_TIMEOUT);
    if (c->framing) {
        dray_srv_fail(&e, c->framing, "invalid_request_error",
                      c->framing == 415 ? "unsupported_media_type" : c->framing == 501 ? "not_implemented" : NULL,
                      NULL, "%s", c->framing_why);
        return dray_srv_send_error(c, &e);
    }
    if (!known_method(c->method)) {
        dray_srv_fail(&e, 501, "invalid_request_error", "not_implemented", NULL,
                      "method %.32s is not implemented (this server answers GET, HEAD and POST)", c->method);
        return dray_srv_send_error(c, &e);
    }
    const char *auth = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    bool open = !strcmp(c->path, "/health"); /* load balancers probe without a key */
    if (!open && dray_srv_check_auth(auth, c->srv->cfg->api_key, &e))
        return dray_srv_send_error(c, &e);
    if (c->too_big && dray_srv_check_body(UINT64_MAX, c->srv->cfg->max_body, &e))
        return dray_srv_send_error(c, &e);
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (routes[i].prefix ? strncmp(c->path, routes[i].path, strlen(routes[i].path))
                             : strcmp(c->path, routes[i].path))
            continue;
        /* HEAD is GET without the body (libmicrohttpd leaves the body out) */
        bool head = !strcmp(c->method, "HEAD") && !strcmp(routes[i].method, "GET");
        if (!head && strcmp(c->method, routes[i].method)) {
            c->allow = routes[i].method;
            dray_srv_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                          "%s takes %s, not %s", routes[i].path, routes[i].method, c->method);
            return dray_srv_send_error(c, &e);
        }
        return routes[i].serve(c, routes[i].kind);
    }
    dray_srv_fail(&e, 404, "invalid_request_error", "not_found", NULL,
                  "no such endpoint: %s %.100s (this server has POST /v1/chat/completions, POST "
                  "/v1/completions, GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST "
                  "/detokenize, GET /health, GET /metrics)", c->method, c->path);
    return dray_srv_send_error(c, &e);
}

/* ------------------------------------------------------------ libmicrohttpd */

/* Percent-decoding of the URL in place, as libmicrohttpd's own does, except that
 * %00 stays as it is: decoded, "/health%00.json" was the C string "/health". */
static size_t unescape(void *cls, struct MHD_Connection *mc, char *s)
{
    (void)cls;
    (void)mc;
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hex_digit(r[1])) >= 0 && (lo = hex_digit(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi << 4 | lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
    return (size_t)(w - s);
}

/* The headers framing depends on, counted over every line (libmicrohttpd's
 * lookup returns only the first of a repeated header). */
struct framing_scan {
    unsigned n_length, n_host;
    bool lengths_differ;
    const char *length, *encoding, *transfer;
};

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    struct framing_scan *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        f->lengths_differ = f->lengths_differ || (f->length && strcmp(f->length, value ? value : ""));
        f->length = value ? value : "";
        f->n_length++;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) {
        f->n_host++;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_ENCODING)) {
        f->encoding = value ? value : "";
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        f->transfer = value ? value : "";
    }
    return MHD_YES;
}

/* Framing faults a proxy in front could read otherwise than dray does (request
 * smuggling) or that leave the body unreadable: RFC 9112 sections 3.2 and 6, RFC
 * 9110 8.4. Sets c->framing (400, 415 or 501) and its reason. */
static void check_framing(struct dray_srv_call *c, const char *version)
{
    struct framing_scan f = {0};
    MHD_get_connection_values(c->mc, MHD_HEADER_KIND, scan_header, &f);
    const char *why = NULL;
    int status = 400;
    if (f.lengths_differ)
        why = "Content-Length is given more than once with different values";
    else if (version && !strcmp(version, MHD_HTTP_VERSION_1_1) && f.n_host != 1)
        why = f.n_host ? "more than one Host header" : "HTTP/1.1 requires a Host header";
    else if (f.transfer && f.length)
        why = "both Transfer-Encoding and Content-Length";
    else if (f.transfer && strcasecmp(f.transfer, "chunked"))
        why = "only the chunked Transfer-Encoding is implemented", status = 501;
    else if (f.encoding && strcasecmp(f.encoding, "identity"))
        why = "Content-Encoding is not supported: send the body uncompressed", status = 415;
    if (!why)
        return;
    c->framing = status;
    snprintf(c->framing_why, sizeof(c->framing_why), "%s", why);
}

/* A call is made when libmicrohttpd has read the request line (the URI log
 * callback), so that its own answers to the headers that follow can name it. */
static struct dray_srv_call *call_new(struct dray_srv *s, struct MHD_Connection *mc, const char *url)
{
    struct dray_srv_call *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->srv = s;
    c->mc = mc;
    c->replica = -1;
    c->t0 = dray_srv_now();
    snprintf(c->method, sizeof(c->method), "-");
    snprintf(c->path, sizeof(c->path), "%s", url ? url : "");
    return c;
}

/* The headers are in: the method, the decoded URL, the size and framing checks. */
static void call_start(struct dray_srv_call *c, const char *url, const char *method, const char *version)
{
    struct dray_srv *s = c->srv;
    c->started = true;
    snprintf(c->method, sizeof(c->method), "%s", method);
    snprintf(c->path, sizeof(c->path), "%s", url);
    /* A body over the limit is read and dropped, then refused with 413: most
     * clients (Python's among them) only read the answer once they have sent
     * everything. A declared length far over the limit is refused at once; the
     * connection then closes, since its body is never read. (libmicrohttpd has
     * already refused a Content-Length that is not all digits or over 2^64-1.) */
    const char *cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    uint64_t declared = cl ? strtoull(cl, NULL, 10) : 0;
    c->too_big = declared > s->cfg->max_body;
    check_framing(c, version);
    c->refuse_now = declared / 64 > s->cfg->max_body || c->framing;
}

/* ------------------------------------------------------------ libmicrohttpd's own answers */

/* What the connection's thread knows of libmicrohttpd's log (one thread per
 * connection, so thread-local is per connection): the call of the request
 * being read, the last message before an error answer (its reason), and
 * whether dray has sent that answer itself. */
static _Thread_local struct {
    struct dray_srv_call *call;
    char last[160];
    bool taken;
} tl;

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    tl.call = call_new(cls, mc, uri);
    tl.last[0] = 0;
    tl.taken = false;
    return tl.call;
}

/* Send the OpenAI-shaped answer on the socket, then shut its write side so that
 * libmicrohttpd's HTML one (sent twice after a bad Content-Length by 0.9.75: its
 * parse_connection_headers() error path falls through to a second
 * build_header_response(); fixed upstream in 1.0.0) never reaches the client:
 * its sends fail and it closes the connection. */
static bool take_over(struct MHD_Connection *mc, int status, const char *why)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    size_t len = 0;
    char *resp = ci ? dray_srv_mhd_error_response(status, why, &len) : NULL;
    size_t off = 0;
    double until = dray_srv_now() + 1.0; /* the socket is non-blocking; a fresh one takes it at once */
    while (resp && off < len && dray_srv_now() < until) {
        ssize_t n = send(ci->connect_fd, resp + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else {
            struct pollfd p = {.fd = ci->connect_fd, .events = POLLOUT};
            if (n < 0 && poll(&p, 1, 100) < 0)
                break;
        }
    }
    free(resp);
    if (off)
        shutdown(ci->connect_fd, SHUT_WR);
    return off == len && len;
}

/* MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's messages, as "dray serve:" lines;
 * an answer it makes itself is logged, counted as answered_by="libmicrohttpd",
 * and replaced by dray's JSON where the connection is known (after the request
 * line: a header, Content-Length or chunking fault; not a bad request line,
 * URI or version, which come before libmicrohttpd names the connection). */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct dray_srv *s = cls;
    char text[512];
    int status = dray_srv_mhd_log_read(fmt, ap, text, sizeof(text));
    if (!status) {
        if (tl.taken)
            return; /* its failing sends after take_over */
        snprintf(tl.last, sizeof(tl.last), "%.159s", text);
        fprintf(stderr, "dray serve: libmicrohttpd: %s\n", text);
        return;
    }
    struct dray_srv_call *c = tl.call;
    if (c && c->status)
        return; /* dray has answered already; libmicrohttpd only closes */
    /* its reason: "Failed to parse `Content-Length' header. Closing connection." */
    char why[160];
    const char *cut = strstr(tl.last, " Closing connection.");
    snprintf(why, sizeof(why), "%.*s", (int)(cut ? cut - tl.last : (ptrdiff_t)strlen(tl.last)), tl.last);
    if (!why[0])
        snprintf(why, sizeof(why), "%.159s", text);
    bool json = c && take_over(c->mc, status, why);
    tl.taken = json;
    dray_srv_metrics_count_mhd_status(&s->metrics, status);
    fprintf(stderr, "dray serve: %s %s %d answered by libmicrohttpd (%s): %s\n", c ? c->method : "-",
            c ? c->path : "-", status, json ? "json" : "html", why);
    if (c)
        c->status = -status; /* logged here, not again when it completes */
}

/* ------------------------------------------------------------ requests */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct dray_srv_call *c = *con_cls;
    if (!c) /* no call from on_uri: out of memory there */
        c = *con_cls = call_new(cls, mc, url);
    if (!c)
        return MHD_NO;
    if (!c->started) {
        call_start(c, url, method, version);
        return c->refuse_now ? route(c) : MHD_YES;
    }
    if (*upload_size) {
        if (!c->too_big && c->body.len + *upload_size <= c->srv->cfg->max_body)
            c->too_big = dray_srv_buf_add(&c->body, upload, *upload_size) != 0;
        else
            c->too_big = true;
        if (c->too_big)
            dray_srv_buf_free(&c->body);
        *upload_size = 0;
        return MHD_YES;
    }
    return route(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct dray_srv *s = cls;
    struct dray_srv_call *c = *con_cls;
    if (c == tl.call)
        tl.call = NULL;
    /* the next request on this connection gets the header timeout again */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->cfg->header_timeout);
    if (!c)
        return;
    if (!c->logged && c->status > 0)
        dray_srv_log(c->method, c->path, c->status, c->n_prompt, c->n_cached, c->n_completion,
                     (dray_srv_now() - c->t0) * 1e3, c->replica);
    dray_srv_buf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

int dray_srv_http_start(struct dray_srv *s, char *err, size_t errlen)
{
    char port[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    snprintf(port, sizeof(port), "%u", s->cfg->port);
    int rc = getaddrinfo(s->cfg->host, port, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "host '%s': %s", s->cfg->host, gai_strerror(rc));
        return DRAY_EINVAL;
    }
    /* poll(), not select(): a connection's socket may be past FD_SETSIZE (1024) */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    /* A thread per connection, max_connections of them, max_connections_per_ip
     * from one address: connections that never finish their headers (slowloris)
     * then hold one client's slots, and only for header_timeout seconds. */
    const struct dray_config *cfg = s->cfg;
    s->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s,
                                 /* first, or earlier options' messages go to stderr as they are */
                                 MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->header_timeout,
                                 MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
                                 MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, errlen, "cannot listen on %s port %u (in use, or not an address of this "
                 "machine?)", s->cfg->host, s->cfg->port);
        return DRAY_EIO;
    }
    return 0;
}
