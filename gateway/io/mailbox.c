#include "mailbox.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

int gg_mailbox_init(struct gg_mailbox *m)
{
	memset(m, 0, sizeof(*m));
	m->efd = eventfd(0, EFD_CLOEXEC);
	if (m->efd < 0)
		return -errno;
	pthread_mutex_init(&m->lock, NULL);
	m->owner = pthread_self();
	return 0;
}

void gg_mailbox_fini(struct gg_mailbox *m)
{
	if (m->efd < 0)
		return;
	close(m->efd);
	m->efd = -1;
	pthread_mutex_destroy(&m->lock);
}

void gg_mailbox_claim(struct gg_mailbox *m)
{
	pthread_mutex_lock(&m->lock);
	m->owner = pthread_self();
	pthread_mutex_unlock(&m->lock);
}

int gg_mailbox_arm(struct gg_mailbox *m, struct gg_loop *loop, uint64_t ud)
{
	return gg_loop_read(loop, m->efd, &m->sink, sizeof(m->sink), ud);
}

void gg_mailbox_wake(struct gg_mailbox *m)
{
	uint64_t one = 1;

	/* Cannot fail short of a counter at 2^64 - 1: every read drains it. */
	while (write(m->efd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

void gg_mailbox_post(struct gg_mailbox *m, struct gg_mail *mail)
{
	mail->next = NULL;
	pthread_mutex_lock(&m->lock);
	if (m->tail)
		m->tail->next = mail;
	else
		m->head = mail;
	m->tail = mail;
	bool own = pthread_equal(m->owner, pthread_self());
	pthread_mutex_unlock(&m->lock);
	if (!own)
		gg_mailbox_wake(m);
}

bool gg_mailbox_empty(struct gg_mailbox *m)
{
	pthread_mutex_lock(&m->lock);
	bool empty = !m->head;
	pthread_mutex_unlock(&m->lock);
	return empty;
}

struct gg_mail *gg_mailbox_take(struct gg_mailbox *m)
{
	pthread_mutex_lock(&m->lock);
	struct gg_mail *head = m->head;
	m->head = m->tail = NULL;
	pthread_mutex_unlock(&m->lock);
	return head;
}
