/* A mailbox between threads: any thread posts messages, the one thread
 * that owns it takes them, oldest first.
 *
 * Messages are the poster's allocations with a struct gg_mail at their
 * start; the taker owns them from then on. A post from another thread
 * wakes the owner's io_uring loop through an eventfd whose read the owner
 * keeps armed (gg_mailbox_arm, once per wake-up); a post from the owner's
 * own thread only queues, for the owner drains its mailbox on every turn
 * of its loop anyway. */
#ifndef GG_MAILBOX_H
#define GG_MAILBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "gg_common.h"
#include "uring_loop.h"

struct gg_mail {
	struct gg_mail *next;
	unsigned type; /* the owner's */
};

struct gg_mailbox {
	pthread_mutex_t lock;
	struct gg_mail *head, *tail;
	int efd;
	uint64_t sink;    /* the armed read's target */
	pthread_t owner;
};

/* For the calling thread, which owns it from now on. Returns 0 or a
 * negative errno. */
GG_MUST_CHECK int gg_mailbox_init(struct gg_mailbox *m);
void gg_mailbox_fini(struct gg_mailbox *m);
/* The owner hands the mailbox to the thread that calls this. */
void gg_mailbox_claim(struct gg_mailbox *m);

/* Arms the wake-up read on the owner's loop with user_data `ud`; again
 * after each of its completions. */
GG_MUST_CHECK int gg_mailbox_arm(struct gg_mailbox *m, struct gg_loop *loop, uint64_t ud);

void gg_mailbox_post(struct gg_mailbox *m, struct gg_mail *mail);
/* Wakes the owner without a message (to look at its flags). */
void gg_mailbox_wake(struct gg_mailbox *m);
/* Everything posted so far, oldest first, or NULL. */
struct gg_mail *gg_mailbox_take(struct gg_mailbox *m);
/* Whether nothing waits to be taken: what its owner posted to itself
 * wakes nobody, so the owner asks before it waits. */
bool gg_mailbox_empty(struct gg_mailbox *m);

#endif
