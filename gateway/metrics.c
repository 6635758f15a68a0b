#include "metrics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "control_proto.h"

static void family(struct gg_strbuf *out, const char *name, const char *type, const char *help)
{
	gg_strbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value as the format wants it: backslash, double quote and
 * newline escaped. */
static void label_value(struct gg_strbuf *out, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			gg_strbuf_printf(out, "\\%c", *v);
		else if (*v == '\n')
			gg_strbuf_add(out, "\\n", 2);
		else
			gg_strbuf_add(out, v, 1);
	}
}

/* name{k1="v1",k2="v2"} value: labels as NULL-ended key, value pairs. */
static void sample_labels(struct gg_strbuf *out, const char *name, const char *const *labels, const char *value)
{
	gg_strbuf_printf(out, "%s", name);
	for (unsigned i = 0; labels && labels[i]; i += 2) {
		gg_strbuf_printf(out, "%s%s=\"", i ? "," : "{", labels[i]);
		label_value(out, labels[i + 1]);
		gg_strbuf_add(out, "\"", 1);
	}
	gg_strbuf_printf(out, "%s %s\n", labels && labels[0] ? "}" : "", value);
}

static void sample_u(struct gg_strbuf *out, const char *name, const char *const *labels, uint64_t v)
{
	char text[32];

	snprintf(text, sizeof(text), "%llu", (unsigned long long)v);
	sample_labels(out, name, labels, text);
}

static void sample_f(struct gg_strbuf *out, const char *name, const char *const *labels, double v)
{
	char text[40];

	if (isnan(v))
		snprintf(text, sizeof(text), "NaN");
	else if (isinf(v))
		snprintf(text, sizeof(text), "%s", v > 0 ? "+Inf" : "-Inf");
	else
		snprintf(text, sizeof(text), "%.15g", v);
	sample_labels(out, name, labels, text);
}

typedef uint64_t peer_figure(const struct gg_node_peer_metrics *pm);

#define FIGURE(field) \
	static uint64_t fig_##field(const struct gg_node_peer_metrics *pm) { return pm->field; }
FIGURE(raw_bytes_out)
FIGURE(raw_bytes_in)
FIGURE(data_bytes_out)
FIGURE(data_bytes_in)
FIGURE(wire_bytes_out)
FIGURE(wire_bytes_in)
FIGURE(delivery_bytes_per_s)
FIGURE(streams_up)
FIGURE(stream_ups)
FIGURE(stream_downs)

typedef uint64_t stream_figure(const struct gg_mesh_stream_tcp *t);

#define STREAM_FIGURE(field) \
	static uint64_t sfig_##field(const struct gg_mesh_stream_tcp *t) { return t->field; }
STREAM_FIGURE(rtt_us)
STREAM_FIGURE(rttvar_us)
STREAM_FIGURE(cwnd_bytes)
STREAM_FIGURE(delivery_bytes_per_s)
STREAM_FIGURE(retransmits)
STREAM_FIGURE(unsent_bytes)
STREAM_FIGURE(send_buffer_bytes)
STREAM_FIGURE(receive_buffer_bytes)

/* A family with one sample per peer, or with `received` one per peer and
 * direction (`figure` then gives the bytes sent). */
static void per_peer(struct gg_strbuf *out, const struct gg_metrics_input *in, const char *name, const char *type,
		     const char *help, peer_figure *figure, peer_figure *received)
{
	family(out, name, type, help);
	for (unsigned p = 0; p < in->node->sites; p++) {
		const struct gg_node_peer_metrics *pm = &in->node->peers[p];
		if (!in->peer_names[p])
			continue;
		const char *labels[] = { "peer", in->peer_names[p], received ? "direction" : NULL, "sent", NULL };
		sample_u(out, name, labels, figure(pm));
		if (received) {
			labels[3] = "received";
			sample_u(out, name, labels, received(pm));
		}
	}
}

/* A family with one sample per stream that is up: `figure` of its TCP
 * state, times `scale`. */
static void per_stream(struct gg_strbuf *out, const struct gg_metrics_input *in, const char *name, const char *type,
		       const char *help, stream_figure *figure, double scale)
{
	const struct gg_node_metrics *nm = in->node;
	char stream[12];

	family(out, name, type, help);
	for (unsigned p = 0; p < nm->sites; p++) {
		if (!in->peer_names[p])
			continue;
		for (unsigned s = 0; s < nm->peers[p].streams && s < GG_MESH_MAX_STREAMS; s++) {
			const struct gg_node_stream_metrics *sm = &nm->streams[p][s];
			if (!sm->up)
				continue;
			uint64_t v = figure(&sm->tcp);
			snprintf(stream, sizeof(stream), "%u", s);
			const char *labels[] = { "peer", in->peer_names[p], "stream", stream, NULL };
			if (scale == 1)
				sample_u(out, name, labels, v);
			else
				sample_f(out, name, labels, (double)v * scale);
		}
	}
}

static void render_streams(const struct gg_metrics_input *in, struct gg_strbuf *out)
{
	per_stream(out, in, "gradgate_stream_rtt_seconds", "gauge",
		   "Each stream's smoothed TCP round trip, as the kernel estimates it.",
		   sfig_rtt_us, 1e-6);
	per_stream(out, in, "gradgate_stream_rtt_variation_seconds", "gauge",
		   "The mean deviation of each stream's TCP round trip.",
		   sfig_rttvar_us, 1e-6);
	per_stream(out, in, "gradgate_stream_cwnd_bytes", "gauge", "Each stream's TCP congestion window.",
		   sfig_cwnd_bytes, 1);
	per_stream(out, in, "gradgate_stream_delivery_rate_bytes_per_second", "gauge",
		   "Each stream's delivery rate, as the kernel's TCP estimates it.",
		   sfig_delivery_bytes_per_s, 1);
	per_stream(out, in, "gradgate_stream_retransmitted_segments_total", "counter",
		   "TCP segments each stream sent again, over every connection it had (as last sampled).",
		   sfig_retransmits, 1);
	per_stream(out, in, "gradgate_stream_unsent_bytes", "gauge",
		   "Bytes written to each stream's socket that TCP has not sent yet.",
		   sfig_unsent_bytes, 1);
	per_stream(out, in, "gradgate_stream_send_buffer_bytes", "gauge",
		   "Each stream's socket send buffer, as the kernel counts it (twice what SO_SNDBUF sets).",
		   sfig_send_buffer_bytes, 1);
	per_stream(out, in, "gradgate_stream_receive_buffer_bytes", "gauge",
		   "Each stream's socket receive buffer, as the kernel counts it (twice what SO_RCVBUF sets).",
		   sfig_receive_buffer_bytes, 1);
}

static void render_steps(const struct gg_metrics_input *in, struct gg_strbuf *out)
{
	const struct gg_node_metrics *nm = in->node;
	char le[32];

	family(out, "gradgate_steps_completed_total", "counter", "All-reduce steps completed at every site.");
	sample_u(out, "gradgate_steps_completed_total", NULL, nm->stats.steps_done);

	family(out, "gradgate_step_failures_total", "counter",
	       "Steps failed at this site, by the code their ranks got (enum gg_errc).");
	for (int code = GG_ERR_INVALID; code >= GG_ERR_LIMIT; code--) {
		if (code == GG_ERR_AGAIN)
			continue; /* never a failure */
		const char *labels[] = { "code", gg_errc_name(code), NULL };
		sample_u(out, "gradgate_step_failures_total", labels, nm->failures_by_code[-code]);
	}

	family(out, "gradgate_step_duration_seconds", "histogram",
	       "Completed steps, from the moment every local rank had announced the step to its completion.");
	uint64_t cumulative = 0;
	for (unsigned b = 0; b <= GG_NODE_STEP_BUCKETS; b++) {
		cumulative += nm->step_buckets[b];
		if (b < GG_NODE_STEP_BUCKETS)
			snprintf(le, sizeof(le), "%g", gg_node_step_bucket_s[b]);
		else
			snprintf(le, sizeof(le), "+Inf");
		const char *labels[] = { "le", le, NULL };
		sample_u(out, "gradgate_step_duration_seconds_bucket", labels, cumulative);
	}
	sample_f(out, "gradgate_step_duration_seconds_sum", NULL, nm->step_s_sum);
	sample_u(out, "gradgate_step_duration_seconds_count", NULL, cumulative);

	family(out, "gradgate_step_phase_seconds_total", "counter",
	       "Where the steps' time went, summed over the lanes: the site sum (gather), the codecs (encode, "
	       "decode), the results into the ranks' memory (deliver), and the rest of the time a lane's part "
	       "of a step was in progress (network_wait: frames and DONEs from the peers, TLS, the kernel).");
	const struct {
		const char *phase;
		double s;
	} phases[] = {
		{ "gather", nm->gather_s }, { "encode", nm->encode_s }, { "network_wait", nm->wait_s },
		{ "decode", nm->decode_s }, { "deliver", nm->deliver_s },
	};
	for (unsigned i = 0; i < GG_ARRAY_LEN(phases); i++) {
		const char *labels[] = { "phase", phases[i].phase, NULL };
		sample_f(out, "gradgate_step_phase_seconds_total", labels, phases[i].s);
	}
}

static void render_peers(const struct gg_metrics_input *in, struct gg_strbuf *out)
{
	const struct gg_node_metrics *nm = in->node;

	per_peer(out, in, "gradgate_raw_bytes_total", "counter",
		 "Float32 bytes of the tensors the frames carry, to and from each peer.", fig_raw_bytes_out, fig_raw_bytes_in);
	per_peer(out, in, "gradgate_encoded_bytes_total", "counter",
		 "Bytes of the frames after codec and zstd, to and from each peer (sent: frames a stream took; "
		 "received: frames taken; copies sent again left out).", fig_data_bytes_out, fig_data_bytes_in);
	per_peer(out, in, "gradgate_wire_bytes_total", "counter",
		 "Bytes the TCP streams to and from each peer carried: TLS records of every message, and handshakes.",
		 fig_wire_bytes_out, fig_wire_bytes_in);

	family(out, "gradgate_compression_ratio", "gauge",
	       "Float32 bytes per encoded byte of the frames sent since the start (NaN before the first).");
	sample_f(out, "gradgate_compression_ratio", NULL,
		 nm->stats.data_bytes_out ? (double)nm->stats.raw_bytes_out / (double)nm->stats.data_bytes_out : NAN);

	family(out, "gradgate_peer_rtt_seconds", "gauge", "The last heartbeat round trip to each peer.");
	for (unsigned p = 0; p < nm->sites; p++) {
		const char *labels[] = { "peer", in->peer_names[p], NULL };
		if (in->peer_names[p] && nm->peers[p].rtt_us)
			sample_f(out, "gradgate_peer_rtt_seconds", labels, (double)nm->peers[p].rtt_us * 1e-6);
	}
	per_peer(out, in, "gradgate_peer_delivery_rate_bytes_per_second", "gauge",
		 "Frame bytes each peer acknowledged per second of time with data in flight to it, over the last "
		 "second of such time (0 until one was measured).", fig_delivery_bytes_per_s, NULL);
	per_peer(out, in, "gradgate_peer_streams_up", "gauge", "Streams to each peer that are up, of streams_per_peer.",
		 fig_streams_up, NULL);
	per_peer(out, in, "gradgate_peer_stream_ups_total", "counter", "Streams to each peer that came up.", fig_stream_ups,
		 NULL);
	per_peer(out, in, "gradgate_peer_stream_downs_total", "counter",
		 "Streams to each peer that were up and went down.", fig_stream_downs, NULL);
	family(out, "gradgate_peer_last_heard_timestamp_seconds", "gauge",
	       "When anything was last received from each peer (Unix time).");
	for (unsigned p = 0; p < nm->sites; p++) {
		const struct gg_node_peer_metrics *pm = &nm->peers[p];
		const char *labels[] = { "peer", in->peer_names[p], NULL };
		if (in->peer_names[p] && pm->heard_us && pm->heard_us <= in->now_us)
			sample_f(out, "gradgate_peer_last_heard_timestamp_seconds", labels,
				 in->now_unix_s - (double)(in->now_us - pm->heard_us) * 1e-6);
	}

	family(out, "gradgate_stream_failures_total", "counter",
	       "Streams that never came up, by why: the TLS handshake's failures, and peers whose settings "
	       "disagree with this site's (mismatch).");
	for (unsigned f = 1; f < GG_MESH_FAILURES; f++) {
		const char *labels[] = { "reason", gg_mesh_failure_name(f), NULL };
		sample_u(out, "gradgate_stream_failures_total", labels, nm->stream_failures[f]);
	}
	family(out, "gradgate_resent_messages_total", "counter",
	       "Data messages sent again after a stream to their peer was cut.");
	sample_u(out, "gradgate_resent_messages_total", NULL, nm->stats.resent_messages);
	family(out, "gradgate_hedged_frames_total", "counter",
	       "Data frames sent once more on another stream because their own was slow to take them.");
	sample_u(out, "gradgate_hedged_frames_total", NULL, nm->stats.hedged_frames);
}

void gg_metrics_render(const struct gg_metrics_input *in, struct gg_strbuf *out)
{
	const struct gg_node_metrics *nm = in->node;
	const struct gg_host_backend_stats *hs = in->host;

	family(out, "gradgate_build_info", "gauge", "The gateway's version and site; always 1.");
	const char *build[] = { "version", in->version, "site", in->site, NULL };
	sample_u(out, "gradgate_build_info", build, 1);
	family(out, "gradgate_start_time_seconds", "gauge", "When the gateway started (Unix time).");
	sample_f(out, "gradgate_start_time_seconds", NULL, in->start_unix_s);

	render_steps(in, out);
	render_peers(in, out);
	render_streams(in, out);

	family(out, "gradgate_tls_seconds_total", "counter",
	       "Seconds the lanes spent sealing and opening TLS records (time in those calls, on the lanes' threads).");
	sample_f(out, "gradgate_tls_seconds_total", NULL, nm->stats.tls_s);

	family(out, "gradgate_memory_bytes", "gauge",
	       "Buffer memory held: float32 sums of bfloat16 steps and the buffers jobs keep for their next step "
	       "(sums), error-feedback residuals (feedback), each bounded by [limits] memory; frames for steps "
	       "not started here (early), with 384 bytes of bookkeeping each, bounded per lane and peer by 1.5 "
	       "x inflight_per_peer and a frame per stream.");
	const char *sums[] = { "use", "sums", NULL }, *feedback[] = { "use", "feedback", NULL },
		   *early[] = { "use", "early", NULL };
	sample_u(out, "gradgate_memory_bytes", sums, hs->sum_bytes + hs->spare_bytes);
	sample_u(out, "gradgate_memory_bytes", feedback, nm->feedback_bytes);
	sample_u(out, "gradgate_memory_bytes", early, nm->stats.early_bytes);
	family(out, "gradgate_memory_limit_bytes", "gauge", "[limits] memory.");
	sample_u(out, "gradgate_memory_limit_bytes", NULL, in->memory_limit_bytes);

	family(out, "gradgate_jobs", "gauge", "Jobs with ranks connected to this gateway.");
	sample_u(out, "gradgate_jobs", NULL, hs->jobs);
	family(out, "gradgate_sessions", "gauge", "Ranks connected to their jobs (client library sessions).");
	sample_u(out, "gradgate_sessions", NULL, hs->sessions);
}
