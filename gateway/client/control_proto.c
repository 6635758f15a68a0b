#include "control_proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gg_common.h"

static const struct {
	const char *name;
	size_t size;
	bool from_gateway; /* the gateway sends it; a client, the others */
} ctrl_types[] = {
	[GG_CTRL_HELLO] = { "HELLO", sizeof(struct gg_ctrl_hello), false },
	[GG_CTRL_ACCEPT] = { "ACCEPT", sizeof(struct gg_ctrl_accept), true },
	[GG_CTRL_REFUSE] = { "REFUSE", sizeof(struct gg_ctrl_error), true },
	[GG_CTRL_MAP] = { "MAP", sizeof(struct gg_ctrl_map), false },
	[GG_CTRL_UNMAP] = { "UNMAP", sizeof(struct gg_ctrl_unmap), false },
	[GG_CTRL_ALLREDUCE] = { "ALLREDUCE", sizeof(struct gg_ctrl_allreduce), false },
	[GG_CTRL_DONE] = { "DONE", sizeof(struct gg_ctrl_done), true },
	[GG_CTRL_ERROR] = { "ERROR", sizeof(struct gg_ctrl_error), true },
	[GG_CTRL_STATUS] = { "STATUS", sizeof(struct gg_ctrl_status), false },
	[GG_CTRL_STATUS_SITE] = { "STATUS_SITE", sizeof(struct gg_ctrl_status_site), true },
	[GG_CTRL_STATUS_PEER] = { "STATUS_PEER", sizeof(struct gg_ctrl_status_peer), true },
	[GG_CTRL_STATUS_JOB] = { "STATUS_JOB", sizeof(struct gg_ctrl_status_job), true },
	[GG_CTRL_STATUS_FAILURE] = { "STATUS_FAILURE", sizeof(struct gg_ctrl_status_failure), true },
	[GG_CTRL_MAP_CUDA] = { "MAP_CUDA", sizeof(struct gg_ctrl_map_cuda), false },
	[GG_CTRL_NCCL_JOIN] = { "NCCL_JOIN", sizeof(struct gg_ctrl_nccl_join), false },
	[GG_CTRL_NCCL_ID] = { "NCCL_ID", sizeof(struct gg_ctrl_nccl_id), true },
};

static bool known_type(unsigned type)
{
	return type > 0 && type < GG_ARRAY_LEN(ctrl_types);
}

GRADGATE_API const char *gg_strerror(int code)
{
	switch (code) {
	case GG_OK: return "success";
	case GG_ERR_INVALID: return "invalid argument";
	case GG_ERR_NOMEM: return "out of memory";
	case GG_ERR_SYSTEM: return "system call failed";
	case GG_ERR_CONNECT: return "cannot reach the gateway";
	case GG_ERR_REFUSED: return "refused by the gateway";
	case GG_ERR_PROTOCOL: return "control protocol violated";
	case GG_ERR_CLOSED: return "connection to the gateway lost";
	case GG_ERR_TIMEOUT: return "deadline passed";
	case GG_ERR_TOO_LARGE: return "tensor larger than the gateway allows";
	case GG_ERR_MISMATCH: return "ranks announced different tensors";
	case GG_ERR_RANK: return "another rank of the job failed";
	case GG_ERR_SITE: return "exchange with another site failed";
	case GG_ERR_BUSY: return "too many requests in flight";
	case GG_ERR_AGAIN: return "request still in progress";
	case GG_ERR_LIMIT: return "gateway limit reached";
	}
	return "unknown error";
}

const char *gg_errc_name(int code)
{
	static const char *const names[] = {
		"GG_OK", "GG_ERR_INVALID", "GG_ERR_NOMEM", "GG_ERR_SYSTEM", "GG_ERR_CONNECT", "GG_ERR_REFUSED",
		"GG_ERR_PROTOCOL", "GG_ERR_CLOSED", "GG_ERR_TIMEOUT", "GG_ERR_TOO_LARGE", "GG_ERR_MISMATCH",
		"GG_ERR_RANK", "GG_ERR_SITE", "GG_ERR_BUSY", "GG_ERR_AGAIN", "GG_ERR_LIMIT",
	};

	return code <= 0 && -code < (int)GG_ARRAY_LEN(names) ? names[-code] : NULL;
}

GRADGATE_API size_t gg_dtype_size(enum gg_dtype dtype)
{
	switch (dtype) {
	case GG_DTYPE_F32: return 4;
	case GG_DTYPE_BF16: return 2;
	}
	return 0;
}

const char *gg_dtype_name(uint32_t dtype)
{
	switch (dtype) {
	case GG_DTYPE_F32: return "float32";
	case GG_DTYPE_BF16: return "bfloat16";
	}
	return NULL;
}

const char *gg_ctrl_type_name(unsigned type)
{
	return known_type(type) ? ctrl_types[type].name : "unknown";
}

size_t gg_ctrl_init(union gg_ctrl_msg *msg, enum gg_ctrl_type type)
{
	size_t size = ctrl_types[type].size;

	memset(msg, 0, size);
	msg->hdr.magic = GG_CTRL_MAGIC;
	msg->hdr.type = (uint16_t)type;
	msg->hdr.length = (uint32_t)size;
	return size;
}

/* Checks a text field of message `msg`: terminated within the field, no
 * control characters (messages reach people and logs as one line each),
 * zeros after the end. Otherwise says which of these the field `name`
 * breaks, and where. */
static bool text_ok(const char *field, size_t size, const char *msg, const char *name, char *why, size_t why_size)
{
	const char *nul = memchr(field, 0, size);

	if (!nul) {
		snprintf(why, why_size, "%s: %s is not terminated within its %zu bytes", msg, name, size);
		return false;
	}
	for (const char *p = field; p < nul; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f) {
			snprintf(why, why_size, "%s: %s has control character 0x%02x at %zu", msg, name, (unsigned char)*p,
				 (size_t)(p - field));
			return false;
		}
	for (const char *p = nul; p < field + size; p++)
		if (*p) {
			snprintf(why, why_size, "%s: %s has a nonzero byte at %zu, after its end at %zu", msg, name,
				 (size_t)(p - field), (size_t)(nul - field));
			return false;
		}
	return true;
}

static bool reserved_ok(uint32_t reserved, const char *msg, char *why, size_t why_size)
{
	if (reserved)
		snprintf(why, why_size, "%s: reserved field is %" PRIu32 ", must be 0", msg, reserved);
	return !reserved;
}

int gg_ctrl_check(const union gg_ctrl_msg *msg, size_t len, char *why, size_t why_size)
{
	const struct gg_ctrl_hdr *h = &msg->hdr;
	unsigned type;
	size_t want;

	if (len < sizeof(*h)) {
		snprintf(why, why_size, "truncated message: %zu bytes, shorter than a header", len);
		return GG_ERR_PROTOCOL;
	}
	if (h->magic != GG_CTRL_MAGIC) {
		snprintf(why, why_size, "not a gradgate control message (magic 0x%08x)", (unsigned)h->magic);
		return GG_ERR_PROTOCOL;
	}
	type = h->type;
	if (!known_type(type)) {
		snprintf(why, why_size, "unknown message type %u", type);
		return GG_ERR_PROTOCOL;
	}
	want = ctrl_types[type].size;
	if (type == GG_CTRL_HELLO && len >= sizeof(*h) + sizeof(uint32_t) && len <= GG_CTRL_RECV_MAX &&
	    len == h->length && msg->hello.version != GG_CTRL_VERSION)
		return GG_CTRL_HELLO;
	if (len > GG_CTRL_RECV_MAX) {
		snprintf(why, why_size, "%s message of %zu bytes; it has %zu", ctrl_types[type].name, len, want);
		return GG_ERR_PROTOCOL;
	}
	if (h->length > GG_CTRL_RECV_MAX) {
		snprintf(why, why_size, "%s header says %u bytes, more than any message (%zu at most); the packet has "
			 "%zu", ctrl_types[type].name, (unsigned)h->length, (size_t)GG_CTRL_RECV_MAX, len);
		return GG_ERR_PROTOCOL;
	}
	if (len < h->length) {
		snprintf(why, why_size, "truncated %s: %zu of %u bytes", ctrl_types[type].name, len,
			 (unsigned)h->length);
		return GG_ERR_PROTOCOL;
	}
	if (len != h->length) {
		snprintf(why, why_size, "%s header says %u bytes but the packet has %zu", ctrl_types[type].name,
			 (unsigned)h->length, len);
		return GG_ERR_PROTOCOL;
	}
	if (len != want) {
		snprintf(why, why_size, "%s %s: %zu of %zu bytes", len < want ? "truncated" : "oversized",
			 ctrl_types[type].name, len, want);
		return GG_ERR_PROTOCOL;
	}
	if (h->flags || h->reserved) {
		snprintf(why, why_size, "%s: header %s is %u, must be 0", ctrl_types[type].name,
			 h->flags ? "flags field" : "reserved field", h->flags ? (unsigned)h->flags : (unsigned)h->reserved);
		return GG_ERR_PROTOCOL;
	}

	const char *n = ctrl_types[type].name;
	bool ok = true;
	switch (type) {
	case GG_CTRL_HELLO:
		ok = reserved_ok(msg->hello.reserved, n, why, why_size) &&
		     text_ok(msg->hello.job, sizeof(msg->hello.job), n, "job", why, why_size);
		break;
	case GG_CTRL_ACCEPT:
		ok = reserved_ok(msg->accept.reserved, n, why, why_size) &&
		     text_ok(msg->accept.site, sizeof(msg->accept.site), n, "site", why, why_size);
		break;
	case GG_CTRL_REFUSE:
	case GG_CTRL_ERROR:
		ok = reserved_ok(msg->error.reserved, n, why, why_size) &&
		     text_ok(msg->error.message, sizeof(msg->error.message), n, "message", why, why_size);
		break;
	case GG_CTRL_MAP:
		ok = reserved_ok(msg->map.reserved, n, why, why_size);
		break;
	case GG_CTRL_MAP_CUDA:
		ok = reserved_ok(msg->map_cuda.reserved, n, why, why_size);
		break;
	case GG_CTRL_UNMAP:
		ok = reserved_ok(msg->unmap.reserved, n, why, why_size);
		break;
	case GG_CTRL_NCCL_ID:
		ok = msg->nccl_id.nranks >= 2 && msg->nccl_id.root == msg->nccl_id.nranks - 1;
		if (!ok)
			snprintf(why, why_size, "%s: root %" PRIu32 " of %" PRIu32 " ranks; the root is the last of at least 2",
				 n, msg->nccl_id.root, msg->nccl_id.nranks);
		break;
	case GG_CTRL_DONE:
		ok = !(msg->done.flags & ~GG_CTRL_DONE_NCCL_ABORTED);
		if (!ok)
			snprintf(why, why_size, "%s: unknown flags 0x%" PRIx32, n,
				 (uint32_t)(msg->done.flags & ~GG_CTRL_DONE_NCCL_ABORTED));
		ok = ok && text_ok(msg->done.message, sizeof(msg->done.message), n, "message", why, why_size);
		break;
	case GG_CTRL_STATUS:
		ok = reserved_ok(msg->status.reserved, n, why, why_size);
		break;
	case GG_CTRL_STATUS_SITE:
		ok = text_ok(msg->status_site.site, sizeof(msg->status_site.site), n, "site", why, why_size) &&
		     text_ok(msg->status_site.gateway_version, sizeof(msg->status_site.gateway_version), n,
			     "gateway_version", why, why_size);
		break;
	case GG_CTRL_STATUS_PEER:
		ok = text_ok(msg->status_peer.site, sizeof(msg->status_peer.site), n, "site", why, why_size) &&
		     text_ok(msg->status_peer.address, sizeof(msg->status_peer.address), n, "address", why, why_size);
		break;
	case GG_CTRL_STATUS_JOB:
		ok = text_ok(msg->status_job.job, sizeof(msg->status_job.job), n, "job", why, why_size);
		break;
	case GG_CTRL_STATUS_FAILURE:
		ok = reserved_ok(msg->status_failure.reserved, n, why, why_size) &&
		     text_ok(msg->status_failure.job, sizeof(msg->status_failure.job), n, "job", why, why_size) &&
		     text_ok(msg->status_failure.message, sizeof(msg->status_failure.message), n, "message", why,
			     why_size);
		break;
	default:
		break;
	}
	if (!ok)
		return GG_ERR_PROTOCOL;
	return (int)type;
}

bool gg_ctrl_from_gateway(const union gg_ctrl_msg *msg, size_t len)
{
	const struct gg_ctrl_hdr *h = &msg->hdr;

	return len >= sizeof(*h) && h->magic == GG_CTRL_MAGIC && known_type(h->type) && len == h->length &&
	       len == ctrl_types[h->type].size && ctrl_types[h->type].from_gateway;
}

void gg_ctrl_set_text(char *field, size_t size, const char *text)
{
	size_t n = strlen(text);

	if (n >= size) {
		n = size - 1;
		while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)
			n--;
	}
	memcpy(field, text, n);
	memset(field + n, 0, size - n);
}

bool gg_ctrl_job_name_ok(const char *job, char *why, size_t why_size)
{
	size_t n = strnlen(job, GG_CTRL_NAME_SIZE);

	if (n == 0 || n >= GG_CTRL_NAME_SIZE) {
		snprintf(why, why_size, "job name must have 1 to %d characters", GG_CTRL_NAME_SIZE - 1);
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)job[i];
		if (!gg_job_name_char_ok(c)) {
			snprintf(why, why_size, "job name has character 0x%02x at %zu; allowed are A-Z a-z 0-9 . _ -",
				 c, i);
			return false;
		}
	}
	return true;
}

void gg_ctrl_attach_fd(struct msghdr *mh, void *cbuf, int fd)
{
	memset(cbuf, 0, GG_CTRL_CMSG_BYTES);
	mh->msg_control = cbuf;
	mh->msg_controllen = GG_CTRL_CMSG_BYTES;
	struct cmsghdr *c = CMSG_FIRSTHDR(mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
}
