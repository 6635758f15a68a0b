/* For the tests that run a node in-process: the node of a configuration
 * given as text, or a counted failure. Include after gg_check.h. */
#ifndef GG_NODE_CHECK_H
#define GG_NODE_CHECK_H

#include <string.h>

#include "gradgate.h"
#include "node.h"

/* Loads `text` (named `file` in messages) into *cfg and makes its node.
 * NULL, with the failure counted and *cfg freed, when either fails; else
 * the caller frees the node, then *cfg. */
static inline struct gg_node *gg_check_node_new(const char *text, const char *file, struct gg_config *cfg)
{
	struct gg_diag diag = { 0 };
	struct gg_node *node;
	char err[GG_NODE_ERROR_MAX];

	if (gg_config_load_text(text, strlen(text), file, NULL, cfg, &diag)) {
		gg_diag_print(&diag, stdout);
		CHECK(0, "bad configuration");
		return NULL;
	}
	if (gg_node_new(cfg, &node, err, sizeof(err))) {
		CHECK(0, "gg_node_new: %s", err);
		gg_config_free(cfg);
		return NULL;
	}
	return node;
}

#endif
