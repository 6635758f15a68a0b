#include "nccl_root.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net_addr.h"

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

static bool listening(int fd)
{
	int on = 0;
	socklen_t len = sizeof(on);

	return !getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) && on;
}

/* Whether fd is a socket that listens at `want`. */
static bool listens_at(int fd, const struct sockaddr_storage *want)
{
	struct stat st;

	if (fstat(fd, &st) || !S_ISSOCK(st.st_mode) || !listening(fd))
		return false;
	return gg_net_local_addr_is(fd, want);
}

/* A duplicate of the socket of this process that listens at `want`, or -1.
 * The duplicate is taken from the number just found to listen there: a
 * socket closed and another opened in between under the same number is
 * caught by checking the duplicate again. */
static int dup_listener(const struct sockaddr_storage *want)
{
	DIR *d = opendir("/proc/self/fd");
	int dup = -1;

	if (!d)
		return -1;
	for (struct dirent *e; dup < 0 && (e = readdir(d));) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end || end == e->d_name || fd == dirfd(d) || !listens_at((int)fd, want))
			continue;
		dup = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
		if (dup >= 0 && !listens_at(dup, want)) {
			close(dup);
			dup = -1;
		}
	}
	closedir(d);
	return dup;
}

static struct gg_nccl_root *find(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	for (unsigned i = 0; i < r->count; i++)
		if (!memcmp(r->root[i].id, id, GG_NCCL_ROOT_ID_SIZE))
			return &r->root[i];
	return NULL;
}

bool gg_nccl_root_watch(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	struct sockaddr_storage want;

	/* There NCCL puts the root in rank 0, at that address for every id. */
	if (getenv("NCCL_COMM_ID") || !id_address(id, &want) || find(r, id))
		return false;
	if (r->count == r->cap) {
		unsigned cap = r->cap ? 2 * r->cap : 8;
		struct gg_nccl_root *grown = realloc(r->root, cap * sizeof(*grown));
		if (!grown)
			return false;
		r->root = grown;
		r->cap = cap;
	}
	int fd = dup_listener(&want);
	if (fd < 0)
		return false;
	struct gg_nccl_root *root = &r->root[r->count++];
	memcpy(root->id, id, GG_NCCL_ROOT_ID_SIZE);
	root->fd = fd;
	return true;
}

bool gg_nccl_root_end(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	struct gg_nccl_root *root = find(r, id);
	bool stopped = false;

	if (!root)
		return false;
	/* Still listening: NCCL's thread waits in accept(), or ended and
	 * closed only its own descriptor of the socket. */
	if (listening(root->fd))
		stopped = !shutdown(root->fd, SHUT_RDWR);
	close(root->fd);
	*root = r->root[--r->count];
	return stopped;
}

void gg_nccl_roots_free(struct gg_nccl_roots *r)
{
	for (unsigned i = 0; i < r->count; i++)
		close(r->root[i].fd);
	free(r->root);
	*r = (struct gg_nccl_roots){ 0 };
}
