/* JetStream publisher of bench/jetstream_bench.py (built by it with Debian's libnats-dev):
 * creates file-storage stream STREAM with three replicas (retrying while the cluster elects its
 * JetStream leader), publishes SIZE-byte messages to it for SECONDS with at most IN_FLIGHT
 * unacknowledged (js_PublishAsync), waits for every acknowledgment, deletes the stream and
 * prints one JSON line: published, acked, failed, seconds (to the last acknowledgment). */
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Written by the library's one acknowledgment thread, read after js_PublishAsyncComplete. */
static volatile int64_t acked, failed;

static void on_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure) {
    if (pa != NULL) acked++; else failed++;
    natsMsg_Destroy(msg);
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: %s URL STREAM SECONDS SIZE IN_FLIGHT\n", argv[0]); return 2; }
    const char *url = argv[1], *stream = argv[2];
    double seconds = atof(argv[3]);
    int size = atoi(argv[4]);
    int64_t in_flight = atoll(argv[5]);
    natsConnection *nc = NULL; jsCtx *js = NULL; jsOptions jo; jsStreamConfig cfg;
    jsErrCode jerr = 0;
    natsStatus s = natsConnection_ConnectTo(&nc, url);
    if (s != NATS_OK) { fprintf(stderr, "connect: %s\n", natsStatus_GetText(s)); return 1; }
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = in_flight;
    jo.PublishAsync.AckHandler = on_ack;
    jo.PublishAsync.StallWait = 60000;
    s = natsConnection_JetStream(&js, nc, &jo);
    if (s != NATS_OK) { fprintf(stderr, "jetstream: %s\n", natsStatus_GetText(s)); return 1; }
    const char *subjects[1] = {stream};
    jsStreamConfig_Init(&cfg);
    cfg.Name = stream; cfg.Subjects = subjects; cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage; cfg.Replicas = 3;
    /* The cluster elects its JetStream meta leader after start: retry for a while. */
    int64_t give_up = nats_Now() + 60000;
    do {
        s = js_AddStream(NULL, js, &cfg, NULL, &jerr);
        if (s == NATS_OK) break;
        nats_Sleep(250);
    } while (nats_Now() < give_up);
    if (s != NATS_OK) { fprintf(stderr, "add stream: %s (%d)\n", natsStatus_GetText(s), (int)jerr); return 1; }
    char *payload = malloc(size);
    for (int i = 0; i < size; i++) payload[i] = (char)i;
    int64_t published = 0;
    int64_t started = nats_NowInNanoSeconds();
    int64_t deadline = started + (int64_t)(seconds * 1e9);
    while (nats_NowInNanoSeconds() < deadline) {
        /* Clock reads per 64 publishes: the loop must not be what limits the rate. */
        for (int i = 0; i < 64; i++) {
            s = js_PublishAsync(js, stream, payload, size, NULL);
            if (s != NATS_OK) { fprintf(stderr, "publish: %s\n", natsStatus_GetText(s)); return 1; }
        }
        published += 64;
    }
    jsPubOptions po; jsPubOptions_Init(&po); po.MaxWait = 120000;
    s = js_PublishAsyncComplete(js, &po);
    double elapsed = (nats_NowInNanoSeconds() - started) / 1e9;
    if (s != NATS_OK) { fprintf(stderr, "complete: %s\n", natsStatus_GetText(s)); return 1; }
    js_DeleteStream(js, stream, NULL, &jerr);
    printf("{\"published\": %lld, \"acked\": %lld, \"failed\": %lld, \"seconds\": %.3f}\n",
           (long long)published, (long long)acked, (long long)failed, elapsed);
    jsCtx_Destroy(js); natsConnection_Destroy(nc); free(payload);
    return 0;
}
