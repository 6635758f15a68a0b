/* Writes the seed corpus of the client fuzz target (fuzz_client.c):
 * sessions whose steps complete on private memory and in shared buffers,
 * several in flight, failed steps, and a gateway that refuses, ends the
 * session, hangs up mid-step, answers the wrong step, with an unknown
 * status, with descriptors, or with limits the library cannot use.
 * usage: gen-client-corpus DIR */
#include <stdio.h>

#include "control_proto.h"
#include "fuzz_script.h"

static struct script_out o;

static void op(enum client_op what)
{
	script_put(&o, what, 1);
}

static void accept_with(uint8_t max_inflight, uint32_t max_message, uint8_t max_regions)
{
	op(CLIENT_GW_ACCEPT);
	script_put(&o, 0, 1);
	script_put(&o, max_inflight, 1);
	script_put(&o, max_message, 4);
	script_put(&o, 0, 4);
	script_put(&o, max_regions, 1);
	script_put(&o, 1000, 2);
	script_put(&o, 100, 2);
	script_put_text(&o, "site-a");
}

static void open_session(void)
{
	accept_with(8, 1u << 20, 64);
	op(CLIENT_OPEN);
	script_put(&o, 0, 1);
	script_put(&o, 2, 1);
}

static void allreduce(uint8_t buffer, uint32_t offset, uint16_t count, uint8_t dtype)
{
	op(CLIENT_ALLREDUCE);
	script_put(&o, buffer, 1);
	script_put(&o, offset, 4);
	script_put(&o, count, 2);
	script_put(&o, dtype, 1);
	script_put(&o, 3, 1);
	script_put(&o, 0, 2);
}

static void done(uint8_t seq, uint8_t status, const char *message)
{
	op(CLIENT_GW_DONE);
	script_put(&o, seq, 1);
	script_put(&o, status, 1);
	script_put_text(&o, message);
}

static void on_request(enum client_op what, uint8_t index)
{
	op(what);
	script_put(&o, index, 1);
}

static void wait_all(uint8_t n)
{
	for (uint8_t i = 0; i < n; i++)
		on_request(CLIENT_WAIT, i);
}

static void gw_error(uint8_t refuse, uint8_t code, const char *message)
{
	op(CLIENT_GW_ERROR);
	script_put(&o, refuse, 1);
	script_put(&o, code, 1);
	script_put(&o, 1, 8);
	script_put_text(&o, message);
}

int main(int argc, char **argv)
{
	int rc = 0;

	const char *dir = script_dir(argc, argv);

	if (!dir)
		return 2;

	/* Steps that complete on private memory, float32 and bfloat16. */
	open_session();
	allreduce(0, 0, 1000, GG_DTYPE_F32);
	done(0, 0, "");
	on_request(CLIENT_WAIT, 0);
	on_request(CLIENT_FREE_REQUEST, 0);
	allreduce(0, 0, 333, GG_DTYPE_BF16);
	done(0, 0, "");
	on_request(CLIENT_WAIT, 0);
	op(CLIENT_CLOSE);
	rc |= script_save(&o, dir, "private");

	/* Shared buffers: steps in place, at offsets; a buffer freed in use. */
	open_session();
	op(CLIENT_BUFFER_ALLOC);
	script_put(&o, 20000, 2);
	op(CLIENT_BUFFER_ALLOC);
	script_put(&o, 4096, 2);
	allreduce(1, 0, 2000, GG_DTYPE_F32);
	allreduce(1, 8000, 1000, GG_DTYPE_F32);
	allreduce(2, 2, 100, GG_DTYPE_BF16);
	on_request(CLIENT_BUFFER_FREE, 0);
	done(0, 0, "");
	done(0, 0, "");
	done(0, 0, "");
	wait_all(3);
	on_request(CLIENT_BUFFER_FREE, 1);
	rc |= script_save(&o, dir, "shared");

	/* As many in flight as allowed and one more; steps that fail. */
	open_session();
	for (int i = 0; i < 9; i++)
		allreduce(0, 0, (uint16_t)(100 + i), GG_DTYPE_F32);
	done(0, 8, "step 1 (tensor 3): timed out after 1000 ms waiting for rank 1 of job 'fuzz-job'");
	done(0, 12, "");
	done(0, 0, "");
	wait_all(9);
	on_request(CLIENT_FREE_REQUEST, 4);
	op(CLIENT_CLOSE);
	on_request(CLIENT_WAIT, 5);
	rc |= script_save(&o, dir, "inflight");

	/* The gateway refuses; another time it ends the session mid-step. */
	gw_error(1, 5, "rank 0 of job 'fuzz-job' is already connected");
	op(CLIENT_OPEN);
	script_put(&o, 0, 1);
	script_put(&o, 2, 1);
	open_session();
	allreduce(0, 0, 10, GG_DTYPE_F32);
	gw_error(0, 7, "the gateway of site site-a is shutting down");
	on_request(CLIENT_WAIT, 0);
	rc |= script_save(&o, dir, "refuse-error");

	/* The gateway hangs up mid-step; the library opens a new session. */
	open_session();
	allreduce(0, 0, 10, GG_DTYPE_F32);
	op(CLIENT_GW_CLOSE);
	on_request(CLIENT_WAIT, 0);
	allreduce(0, 0, 10, GG_DTYPE_F32);
	op(CLIENT_CLOSE);
	open_session();
	rc |= script_save(&o, dir, "hang-up");

	/* Answers that break the protocol: the wrong step, a status that is
	 * not a gg_errc, descriptors, an unusable ACCEPT. */
	static const struct {
		uint8_t seq, status;
		uint8_t fds;
	} bad[] = { { 2, 0, 0 }, { 0, 200, 0 }, { 0, 0, 1 } };
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char name[32];
		open_session();
		allreduce(0, 0, 10, GG_DTYPE_F32);
		allreduce(0, 0, 10, GG_DTYPE_F32);
		if (bad[i].fds) {
			union gg_ctrl_msg m = { 0 };
			size_t len = gg_ctrl_init(&m, GG_CTRL_DONE);
			m.done.seq = 1;
			op(CLIENT_GW_RAW);
			script_put(&o, len, 2);
			script_put_bytes(&o, &m, len);
			script_put(&o, bad[i].fds, 1);
		} else {
			done(bad[i].seq, bad[i].status, "");
		}
		wait_all(2);
		snprintf(name, sizeof(name), "bad-answer-%u", i);
		rc |= script_save(&o, dir, name);
	}
	accept_with(0, 0, 1);
	op(CLIENT_OPEN);
	script_put(&o, 1, 1);
	script_put(&o, 2, 1);
	rc |= script_save(&o, dir, "bad-accept");
	return rc ? 1 : 0;
}
