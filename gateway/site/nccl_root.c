#include "nccl_root.h"

#include <dirent.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* Where an ncclUniqueId keeps the root's address: after its 8-byte magic
 * (struct ncclBootstrapHandle). */
#define ID_ADDR_OFFSET 8

/* The root's address from `id`; false when it holds no IPv4 or IPv6 one. */
static bool id_address(const unsigned char id[GG_NCCL_ROOT_ID_SIZE], struct sockaddr_storage *ss)
{
	sa_family_t family;

	memcpy(&family, id + ID_ADDR_OFFSET, sizeof(family));
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET)
		memcpy(ss, id + ID_ADDR_OFFSET, sizeof(struct sockaddr_in));
	else if (family == AF_INET6)
		memcpy(ss, id + ID_ADDR_OFFSET, sizeof(struct sockaddr_in6));
	else
		return false;
	return true;
}

static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
	return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr));
}

/* Whether fd is a socket that listens at `want`; its inode in *st. */
static bool listens_at(int fd, const struct sockaddr_storage *want, struct stat *st)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	int listening = 0;
	socklen_t optlen = sizeof(listening);

	if (fstat(fd, st) || !S_ISSOCK(st->st_mode))
		return false;
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) || !listening)
		return false;
	return !getsockname(fd, (struct sockaddr *)&ss, &len) && same_address(&ss, want);
}

static struct gg_nccl_root *find(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	for (unsigned i = 0; i < GG_NCCL_ROOTS_MAX; i++)
		if (r->root[i].used && !memcmp(r->root[i].id, id, GG_NCCL_ROOT_ID_SIZE))
			return &r->root[i];
	return NULL;
}

bool gg_nccl_root_watch(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	struct sockaddr_storage want;
	struct stat st;
	int found = -1;

	if (!id_address(id, &want))
		return false;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return false;
	for (struct dirent *e; found < 0 && (e = readdir(d));) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end || end == e->d_name || fd == dirfd(d))
			continue;
		if (listens_at((int)fd, &want, &st))
			found = (int)fd;
	}
	closedir(d);
	if (found < 0)
		return false;
	struct gg_nccl_root *slot = find(r, id);
	for (unsigned i = 0; !slot && i < GG_NCCL_ROOTS_MAX; i++)
		if (!r->root[i].used)
			slot = &r->root[i];
	if (!slot) {
		slot = &r->root[r->next];
		r->next = (r->next + 1) % GG_NCCL_ROOTS_MAX;
	}
	*slot = (struct gg_nccl_root){ .used = true, .fd = found, .dev = st.st_dev, .ino = st.st_ino };
	memcpy(slot->id, id, GG_NCCL_ROOT_ID_SIZE);
	return true;
}

bool gg_nccl_root_end(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	struct gg_nccl_root *root = find(r, id);
	struct sockaddr_storage want;
	struct stat st;
	bool stopped = false;

	if (!root)
		return false;
	/* The same socket, still listening at the id's address: NCCL has not
	 * closed it (a closed one's number may be another file's by now). */
	if (id_address(id, &want) && listens_at(root->fd, &want, &st) && st.st_dev == root->dev &&
	    st.st_ino == root->ino)
		stopped = !shutdown(root->fd, SHUT_RDWR);
	root->used = false;
	return stopped;
}
