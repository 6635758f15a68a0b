/* Two engines wired back to back in memory, no sockets: the handshake
 * matrix with exact messages on both sides, data integrity across record
 * and ring boundaries, bounded rings, clean shutdown, garbage and EOF. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tls_engine.h"
#include "tls_internal.h"
#include "tls_pki.h"
#include "tls_test.h"

static struct gg_tls_pki *ca, *foreign_ca;

static struct gg_tls_context *make_ctx_groups(struct gg_tls_pki *issuer, struct gg_tls_cert_request req,
					      const char *suites, const char *groups)
{
	struct gg_tls_context *ctx;
	char *cert, *key, err[256];

	if (!req.valid_until_s)
		req.valid_until_s = 3600;
	CHECK(gg_tls_pki_issue(issuer, &req, &cert, &key) == 0);
	struct gg_tls_options o = {
		.ca_pem = gg_tls_pki_ca_pem(ca), .cert_pem = cert, .key_pem = key, .ciphersuites = suites,
		.groups = groups, .unchecked_own_cert = issuer != ca || req.no_client_auth || req.no_server_auth ||
							 req.no_signature || req.ca,
	};
	if (gg_tls_context_new(&o, &ctx, err, sizeof(err))) {
		fprintf(stderr, "context: %s\n", err);
		exit(1);
	}
	free(cert);
	free(key);
	return ctx;
}

static struct gg_tls_context *make_ctx(struct gg_tls_pki *issuer, struct gg_tls_cert_request req, const char *suites)
{
	return make_ctx_groups(issuer, req, suites, NULL);
}

static struct gg_tls_site site(const char *name, const char *identity)
{
	struct gg_tls_site s;
	const char *why;

	CHECK(gg_tls_site_init(&s, name, identity, &why) == 0);
	return s;
}

static struct gg_tls_engine *make_engine(struct gg_tls_context *ctx, enum gg_tls_role role, const char *addr,
					 const struct gg_tls_site *sites, size_t n, size_t ring_bytes)
{
	struct gg_tls_engine *e;
	struct gg_tls_engine_config cfg = {
		.role = role, .peer_addr = addr, .sites = sites, .site_count = n,
		.rx_ring_bytes = ring_bytes, .tx_ring_bytes = ring_bytes,
	};
	CHECK(gg_tls_engine_new(ctx, &cfg, &e) == 0);
	return e;
}

/* Moves ciphertext from one engine to the other; returns bytes moved. */
static size_t pump(struct gg_tls_engine *from, struct gg_tls_engine *to)
{
	size_t moved = 0, n;
	const uint8_t *src;
	uint8_t *dst;

	while ((n = gg_tls_engine_tx_data(from, &src))) {
		size_t space = gg_tls_engine_rx_space(to, &dst);
		if (!space)
			break;
		n = n < space ? n : space;
		memcpy(dst, src, n);
		gg_tls_engine_rx_commit(to, n);
		gg_tls_engine_tx_consume(from, n);
		moved += n;
	}
	return moved;
}

struct outcome {
	int client_rc, server_rc;
};

static struct outcome handshake(struct gg_tls_engine *c, struct gg_tls_engine *s)
{
	struct outcome o = { -EAGAIN, -EAGAIN };

	for (int round = 0; round < 20; round++) {
		if (o.client_rc == -EAGAIN)
			o.client_rc = gg_tls_engine_handshake(c);
		pump(c, s);
		if (o.server_rc == -EAGAIN)
			o.server_rc = gg_tls_engine_handshake(s);
		size_t moved = pump(s, c);
		if (o.client_rc != -EAGAIN && o.server_rc != -EAGAIN && !moved)
			break;
	}
	return o;
}

struct pair {
	struct gg_tls_context *cctx, *sctx;
	struct gg_tls_engine *c, *s;
};

static void pair_free(struct pair *p)
{
	gg_tls_engine_free(p->c);
	gg_tls_engine_free(p->s);
	gg_tls_context_free(p->cctx);
	gg_tls_context_free(p->sctx);
}

static const struct gg_tls_site site_a_only[] = { { "site-a", { GG_TLS_IDENTITY_DNS, "site-a.gradgate.test" }, false } };

/* Client presents `client_req` issued by `client_issuer` and dials a server
 * it expects to be `want_server`; the server presents `server_req` and
 * admits `admit`. */
static struct pair setup(struct gg_tls_pki *client_issuer, struct gg_tls_cert_request client_req,
			 struct gg_tls_cert_request server_req, struct gg_tls_site want_server,
			 const struct gg_tls_site *admit, size_t admit_count)
{
	struct pair p;

	p.cctx = make_ctx(client_issuer, client_req, NULL);
	p.sctx = make_ctx(ca, server_req, NULL);
	p.c = make_engine(p.cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want_server, 1, 0);
	p.s = make_engine(p.sctx, GG_TLS_SERVER, "10.0.0.1:40000", admit, admit_count, 0);
	return p;
}

static const struct gg_tls_cert_request site_a_cert = { .identity = "dns:site-a.gradgate.test" };
static const struct gg_tls_cert_request site_b_cert = { .identity = "dns:site-b.gradgate.test" };
static const struct gg_tls_cert_request site_c_cert = { .identity = "dns:site-c.gradgate.test" };

/* After a server-side refusal the TLS 1.3 client has finished its
 * handshake already; it learns the refusal on its first read. */
static void client_learns_refusal(struct pair *p, const char *want)
{
	char buf[64];
	ssize_t n = gg_tls_engine_read(p->c, buf, sizeof(buf));

	CHECK_EQ_INT(n, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p->c), GG_TLS_FAIL_REFUSED);
	CHECK_STR(gg_tls_engine_error(p->c), want);
}

/* Runs the handshake, which the server must refuse with `failure`,
 * saying `want`. */
static void server_refuses(struct pair *p, enum gg_tls_failure failure, const char *want)
{
	struct outcome o = handshake(p->c, p->s);

	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK(!gg_tls_engine_established(p->s));
	CHECK_EQ_INT(gg_tls_engine_failure(p->s), failure);
	CHECK_STR(gg_tls_engine_error(p->s), want);
}

static void test_valid_pair(void)
{
	struct gg_tls_site admit[] = { site("site-c", "dns:site-c.gradgate.test"), site("site-a", "dns:site-a.gradgate.test") };
	struct pair p = setup(ca, site_a_cert, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), admit, 2);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.client_rc, 0);
	CHECK_EQ_INT(o.server_rc, 0);
	CHECK(gg_tls_engine_established(p.c) && gg_tls_engine_established(p.s));
	CHECK_EQ_INT(gg_tls_engine_peer_site(p.s), 1);
	CHECK_EQ_INT(gg_tls_engine_peer_site(p.c), 0);
	CHECK_STR(gg_tls_engine_cipher(p.c), "TLS_AES_256_GCM_SHA384");
	CHECK_STR(gg_tls_engine_error(p.c), "");
	pair_free(&p);
}

static void test_uri_identity(void)
{
	struct gg_tls_cert_request uri_a = { .identity = "uri:spiffe://gradgate/site-a" };
	struct gg_tls_site admit = site("site-a", "uri:spiffe://gradgate/site-a");
	struct pair p = setup(ca, uri_a, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), &admit, 1);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.server_rc, 0);
	CHECK_EQ_INT(o.client_rc, 0);
	pair_free(&p);

	/* A URI must match byte for byte; a DNS identity is not a URI. */
	struct gg_tls_site admit_dns = site("site-a", "dns:site-a");
	p = setup(ca, uri_a, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), &admit_dns, 1);
	server_refuses(&p, GG_TLS_FAIL_IDENTITY,
		       "peer 10.0.0.1:40000: certificate does not name site 'site-a' (expected identity dns:site-a; "
		       "sent alert bad_certificate; certificate names uri:spiffe://gradgate/site-a)");
	pair_free(&p);

	struct gg_tls_site admit_other = site("site-a", "uri:spiffe://gradgate/site-A");
	p = setup(ca, uri_a, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), &admit_other, 1);
	o = handshake(p.c, p.s);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_IDENTITY);
	pair_free(&p);
}

static void test_server_wrong_identity(void)
{
	/* The client dials site-b; the server's certificate names site-c. */
	struct pair p = setup(ca, site_a_cert, site_c_cert, site("site-b", "dns:site-b.gradgate.test"), site_a_only, 1);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.client_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c), GG_TLS_FAIL_IDENTITY);
	CHECK_STR(gg_tls_engine_error(p.c),
		  "peer 10.0.0.2:7001: certificate does not name site 'site-b' (expected identity "
		  "dns:site-b.gradgate.test; sent alert bad_certificate; certificate names dns:site-c.gradgate.test)");
	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_REFUSED);
	CHECK_STR(gg_tls_engine_error(p.s),
		  "peer 10.0.0.1:40000: peer rejected our certificate (wrong site identity or not valid yet?) (expected identity "
		  "dns:site-a.gradgate.test; alert bad_certificate)");
	pair_free(&p);
}

static void test_client_wrong_identity(void)
{
	struct gg_tls_site admit[] = { site("site-a", "dns:site-a.gradgate.test"), site("site-d", "uri:spiffe://gradgate/site-d") };
	struct pair p = setup(ca, site_c_cert, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), admit, 2);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.client_rc, 0);
	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_IDENTITY);
	CHECK_STR(gg_tls_engine_error(p.s),
		  "peer 10.0.0.1:40000: certificate names none of the 2 allowed sites (expected identity "
		  "dns:site-a.gradgate.test or uri:spiffe://gradgate/site-d; sent alert bad_certificate; "
		  "certificate names dns:site-c.gradgate.test)");
	client_learns_refusal(&p, "peer 10.0.0.2:7001: peer rejected our certificate (wrong site identity or not valid yet?) "
				  "(expected identity dns:site-b.gradgate.test; alert bad_certificate)");
	pair_free(&p);
}

/* A site the server knows but does not take connections from proves its
 * identity, and only then is refused, with access_denied: both sides can
 * tell it from a certificate problem. An identity the server does not
 * know at all is still refused during the handshake. */
static void test_denied_site(void)
{
	struct gg_tls_site admit[] = { site("site-a", "dns:site-a.gradgate.test"), site("site-c", "dns:site-c.gradgate.test") };
	admit[0].denied = true;
	struct pair p = setup(ca, site_a_cert, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), admit, 2);

	server_refuses(&p, GG_TLS_FAIL_DENIED,
		       "peer 10.0.0.1:40000: site 'site-a' may not open connections to this site (expected identity "
		       "dns:site-c.gradgate.test; sent alert access_denied; certificate names dns:site-a.gradgate.test)");
	CHECK_EQ_INT(gg_tls_engine_peer_site(p.s), 0);
	CHECK(gg_tls_engine_established(p.c));
	char buf[64];
	CHECK_EQ_INT(gg_tls_engine_read(p.c, buf, sizeof(buf)), -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c), GG_TLS_FAIL_DENIED);
	CHECK_STR(gg_tls_engine_error(p.c),
		  "peer 10.0.0.2:7001: peer accepts our certificate but not connections from this site (access denied) "
		  "(expected identity dns:site-b.gradgate.test; alert access_denied)");
	pair_free(&p);

	/* Every known site denied: an unknown one is still a certificate problem. */
	admit[1].denied = true;
	struct gg_tls_cert_request site_d_cert = { .identity = "dns:site-d.gradgate.test" };
	p = setup(ca, site_d_cert, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), admit, 2);
	server_refuses(&p, GG_TLS_FAIL_IDENTITY,
		       "peer 10.0.0.1:40000: certificate names no site known here (expected identity none: no site may "
		       "connect here; sent alert bad_certificate; certificate names dns:site-d.gradgate.test)");
	client_learns_refusal(&p, "peer 10.0.0.2:7001: peer rejected our certificate (wrong site identity or not valid yet?) "
				  "(expected identity dns:site-b.gradgate.test; alert bad_certificate)");
	pair_free(&p);
}

static void test_common_name_not_trusted(void)
{
	struct gg_tls_cert_request cn_a = { .identity = "dns:site-c.gradgate.test", .common_name = "site-a.gradgate.test" };
	struct pair p = setup(ca, cn_a, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), site_a_only, 1);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_IDENTITY);
	pair_free(&p);
}

static void test_unknown_ca(void)
{
	struct pair p = setup(foreign_ca, site_a_cert, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), site_a_only, 1);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_UNKNOWN_CA);
	CHECK_STR(gg_tls_engine_error(p.s),
		  "peer 10.0.0.1:40000: certificate is not issued by the configured CA (unknown CA) (expected identity "
		  "dns:site-a.gradgate.test; issuer /CN=Foreign CA; sent alert unknown_ca; certificate names "
		  "dns:site-a.gradgate.test)");
	client_learns_refusal(&p, "peer 10.0.0.2:7001: peer does not trust the CA that issued our certificate "
				  "(expected identity dns:site-b.gradgate.test; alert unknown_ca)");
	pair_free(&p);
}

/* A gateway refuses to load a certificate that is not valid yet, so the
 * peer's looks not valid yet to a server whose clock runs two hours
 * behind: its verification time is set back before its engines are made. */
static void test_not_yet_valid(void)
{
	struct gg_tls_cert_request fresh = { .identity = "dns:site-a.gradgate.test", .valid_from_s = -60,
					     .valid_until_s = 9000 };
	const struct gg_tls_site want = site("site-b", "dns:site-b.gradgate.test");
	struct pair p;
	p.cctx = make_ctx(ca, fresh, NULL);
	p.sctx = make_ctx(ca, site_b_cert, NULL);
	SSL_CTX *sc = gg_tls_context_get_ssl_ctx(p.sctx);
	CHECK(sc != NULL);
	X509_VERIFY_PARAM_set_time(SSL_CTX_get0_param(sc), time(NULL) - 7200);
	SSL_CTX_free(sc);
	p.c = make_engine(p.cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want, 1, 0);
	p.s = make_engine(p.sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, 0);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_EXPIRED);
	CHECK_CONTAINS(gg_tls_engine_error(p.s), "peer 10.0.0.1:40000: certificate is not valid yet (expected identity "
						 "dns:site-a.gradgate.test; valid from ");
	client_learns_refusal(&p, "peer 10.0.0.2:7001: peer rejected our certificate (wrong site identity or not valid yet?) "
				  "(expected identity dns:site-b.gradgate.test; alert bad_certificate)");
	pair_free(&p);
}

/* Site a's client certificate `req`, which site b refuses for its use,
 * `detail` naming which extension refuses it. The pair is the caller's. */
static struct pair refused_for_client_use(struct gg_tls_cert_request req, const char *headline, const char *detail)
{
	char want[512];
	struct pair p = setup(ca, req, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), site_a_only, 1);
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_USAGE);
	snprintf(want, sizeof(want),
		 "peer 10.0.0.1:40000: %s (expected identity dns:site-a.gradgate.test; %s; sent alert "
		 "unsupported_certificate; certificate names dns:site-a.gradgate.test)", headline, detail);
	CHECK_STR(gg_tls_engine_error(p.s), want);
	return p;
}

/* A certificate that names two peers' identities (here a DNS name and a
 * URI) would pass for either: refused at both ends, naming both. */
static void test_two_identities(void)
{
	const struct gg_tls_site peers[] = { site("site-a", "dns:site-a.gradgate.test"),
					     site("site-c", "uri:spiffe://gradgate.test/site-c") };
	struct gg_tls_cert_request a_and_c = { .identity = "dns:site-a.gradgate.test",
					       .also = "uri:spiffe://gradgate.test/site-c" };
	struct pair p = setup(ca, a_and_c, site_b_cert, site("site-b", "dns:site-b.gradgate.test"), peers, 2);
	struct outcome o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_IDENTITY);
	CHECK_CONTAINS(gg_tls_engine_error(p.s),
		       "peer 10.0.0.1:40000: certificate names site 'site-a' and site 'site-c' too, so it could pass "
		       "for either (");
	pair_free(&p);

	/* The same when this site dials: the one it dials, and another. */
	const struct gg_tls_site want = site("site-b", "dns:site-b.gradgate.test");
	const struct gg_tls_site others[] = { want, site("site-c", "uri:spiffe://gradgate.test/site-c") };
	struct gg_tls_cert_request b_and_c = { .identity = "dns:site-b.gradgate.test",
					       .also = "uri:spiffe://gradgate.test/site-c" };
	p.cctx = make_ctx(ca, site_a_cert, NULL);
	p.sctx = make_ctx(ca, b_and_c, NULL);
	struct gg_tls_engine_config cfg = { .role = GG_TLS_CLIENT, .peer_addr = "10.0.0.2:7001", .sites = &want,
					    .site_count = 1, .others = others, .other_count = 2 };
	CHECK(gg_tls_engine_new(p.cctx, &cfg, &p.c) == 0);
	p.s = make_engine(p.sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, 0);
	o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.client_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c), GG_TLS_FAIL_IDENTITY);
	CHECK_CONTAINS(gg_tls_engine_error(p.c), "certificate names site 'site-b' and site 'site-c' too, so it could "
						 "pass for either");
	pair_free(&p);

	/* Without the other's name it passes, others or not. */
	p.cctx = make_ctx(ca, site_a_cert, NULL);
	p.sctx = make_ctx(ca, site_b_cert, NULL);
	CHECK(gg_tls_engine_new(p.cctx, &cfg, &p.c) == 0);
	p.s = make_engine(p.sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, 0);
	o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.client_rc, 0);
	CHECK_EQ_INT(o.server_rc, 0);
	pair_free(&p);
}

#define NOT_CLIENT "certificate is not issued for TLS client authentication"

static void test_usage(void)
{
	struct gg_tls_cert_request server_only = { .identity = "dns:site-a.gradgate.test", .no_client_auth = true };
	struct pair p = refused_for_client_use(server_only, NOT_CLIENT, "extended key usage lacks clientAuth");
	client_learns_refusal(&p, "peer 10.0.0.2:7001: peer says our certificate is not issued for this use "
				  "(expected identity dns:site-b.gradgate.test; alert unsupported_certificate)");
	pair_free(&p);

	/* Both uses in the extended key usage, but a key usage that does not
	 * allow signing: the error names the key usage, not the EKU. */
	struct gg_tls_cert_request no_sign = { .identity = "dns:site-a.gradgate.test", .no_signature = true };
	p = refused_for_client_use(no_sign, NOT_CLIENT, "key usage lacks digitalSignature");
	pair_free(&p);

	struct gg_tls_cert_request client_only = { .identity = "dns:site-b.gradgate.test", .no_server_auth = true };
	p = setup(ca, site_a_cert, client_only, site("site-b", "dns:site-b.gradgate.test"), site_a_only, 1);
	struct outcome o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.client_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c), GG_TLS_FAIL_USAGE);
	CHECK_CONTAINS(gg_tls_engine_error(p.c), "certificate is not issued for TLS server authentication");
	CHECK_CONTAINS(gg_tls_engine_error(p.c), "; extended key usage lacks serverAuth;");
	pair_free(&p);

	/* A site's certificate that is a CA's could issue others. */
	struct gg_tls_cert_request ca_leaf = { .identity = "dns:site-a.gradgate.test", .ca = true };
	p = refused_for_client_use(ca_leaf, "certificate may issue others, which no site's may",
				   "it is a CA's (basicConstraints CA:TRUE), which no site's may be");
	pair_free(&p);

	/* A server whose key usage allows key transport but not signing,
	 * which OpenSSL's server purpose takes: TLS 1.3 has it sign. */
	struct gg_tls_cert_request server_no_sign = { .identity = "dns:site-b.gradgate.test", .no_signature = true };
	p = setup(ca, site_a_cert, server_no_sign, site("site-b", "dns:site-b.gradgate.test"), site_a_only, 1);
	o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.client_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c), GG_TLS_FAIL_USAGE);
	CHECK_CONTAINS(gg_tls_engine_error(p.c), "certificate is not issued for TLS server authentication");
	CHECK_CONTAINS(gg_tls_engine_error(p.c), "; key usage lacks digitalSignature;");
	pair_free(&p);
}

/* Key exchange is pinned to elliptic curves: a client that offers only
 * other groups (finite-field ones cost up to hundreds of milliseconds per
 * handshake) is refused, and the refusal names what it offered. */
/* A pair of engines, site-a dialling site-b, over the given contexts. */
static struct pair pair_over(struct gg_tls_context *cctx, struct gg_tls_context *sctx)
{
	struct gg_tls_site want = site("site-b", "dns:site-b.gradgate.test");
	struct pair p = { .cctx = cctx, .sctx = sctx };

	p.c = make_engine(p.cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want, 1, 0);
	p.s = make_engine(p.sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, 0);
	return p;
}

static void test_no_common_group(void)
{
	struct pair p = pair_over(make_ctx_groups(ca, site_a_cert, NULL, "P-384"), make_ctx(ca, site_b_cert, NULL));
	struct outcome o = handshake(p.c, p.s);

	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(o.client_rc, -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.s), GG_TLS_FAIL_GROUP);
	CHECK_STR(gg_tls_engine_error(p.s), "peer 10.0.0.1:40000: peer offers no key-exchange group we accept (expected "
					    "identity dns:site-a.gradgate.test; offered P-384; sent alert handshake_failure)");
	pair_free(&p);

	/* A client pinned to one of the server's groups gets it. */
	p = pair_over(make_ctx_groups(ca, site_a_cert, NULL, "P-256"), make_ctx(ca, site_b_cert, NULL));
	o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.server_rc, 0);
	CHECK_EQ_INT(o.client_rc, 0);
	pair_free(&p);
}

static void test_no_common_suite(void)
{
	struct pair p;

	p = pair_over(make_ctx(ca, site_a_cert, "TLS_CHACHA20_POLY1305_SHA256"),
		      make_ctx(ca, site_b_cert, "TLS_AES_128_GCM_SHA256"));
	struct outcome o = handshake(p.c, p.s);
	CHECK_EQ_INT(o.server_rc, -EPROTO);
	CHECK_EQ_INT(o.client_rc, -EPROTO);
	CHECK_STR(gg_tls_engine_error(p.c),
		  "peer 10.0.0.2:7001: peer found no acceptable parameters (ciphersuites or key-exchange groups?) "
		  "(expected identity "
		  "dns:site-b.gradgate.test; alert handshake_failure)");
	CHECK_CONTAINS(gg_tls_engine_error(p.s), "peer 10.0.0.1:40000: TLS failure: no shared cipher");
	pair_free(&p);
}

static void test_garbage_and_eof(void)
{
	struct gg_tls_context *sctx = make_ctx(ca, site_b_cert, NULL);
	struct gg_tls_engine *s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.9:1234", site_a_only, 1, 0);
	static const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	uint8_t *dst;

	CHECK(gg_tls_engine_rx_space(s, &dst) >= sizeof(http));
	memcpy(dst, http, sizeof(http) - 1);
	gg_tls_engine_rx_commit(s, sizeof(http) - 1);
	CHECK_EQ_INT(gg_tls_engine_handshake(s), -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(s), GG_TLS_FAIL_NOT_TLS);
	CHECK_STR(gg_tls_engine_error(s), "peer 10.0.0.9:1234: peer did not start a TLS handshake (http request) "
					  "(expected identity dns:site-a.gradgate.test)");
	gg_tls_engine_free(s);

	s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.9:1235", site_a_only, 1, 0);
	CHECK_EQ_INT(gg_tls_engine_handshake(s), -EAGAIN);
	gg_tls_engine_rx_eof(s);
	CHECK_EQ_INT(gg_tls_engine_handshake(s), -ECONNRESET);
	CHECK_EQ_INT(gg_tls_engine_failure(s), GG_TLS_FAIL_CLOSED);
	CHECK_STR(gg_tls_engine_error(s), "peer 10.0.0.9:1235: connection closed during the TLS handshake "
					  "(expected identity dns:site-a.gradgate.test)");
	gg_tls_engine_free(s);

	s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.9:1236", site_a_only, 1, 0);
	gg_tls_engine_fail_timeout(s, 250);
	CHECK_EQ_INT(gg_tls_engine_handshake(s), -ETIMEDOUT);
	CHECK_EQ_INT(gg_tls_engine_failure(s), GG_TLS_FAIL_TIMEOUT);
	CHECK_STR(gg_tls_engine_error(s), "peer 10.0.0.9:1236: handshake not completed within 250 ms "
					  "(expected identity dns:site-a.gradgate.test)");
	gg_tls_engine_free(s);
	gg_tls_context_free(sctx);
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

/* Sends `total` bytes in writes of `chunk` through rings of `ring` bytes,
 * reading in pieces of `rchunk`, and checks every byte. */
static void transfer(size_t total, size_t chunk, size_t rchunk, size_t ring)
{
	struct gg_tls_context *cctx = make_ctx(ca, site_a_cert, NULL), *sctx = make_ctx(ca, site_b_cert, NULL);
	struct gg_tls_site want = site("site-b", "dns:site-b.gradgate.test");
	struct gg_tls_engine *c = make_engine(cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want, 1, ring);
	struct gg_tls_engine *s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, ring);
	uint8_t *src = malloc(total + 1), *dst = malloc(total + 1);
	size_t sent = 0, got = 0;
	size_t cap = !ring ? GG_TLS_RING_DEFAULT_BYTES : ring < GG_TLS_RING_MIN_BYTES ? GG_TLS_RING_MIN_BYTES : ring;
	int stalls = 0;

	CHECK(src && dst);
	for (size_t i = 0; i < total; i++)
		src[i] = pattern(i);
	memset(dst, 0xa5, total + 1);
	struct outcome o = handshake(c, s);
	CHECK(o.client_rc == 0 && o.server_rc == 0);
	while (got < total) {
		size_t progress = 0;
		if (sent < total) {
			size_t n = total - sent < chunk ? total - sent : chunk;
			ssize_t w = gg_tls_engine_write(c, src + sent, n);
			CHECK(w > 0 || w == -EAGAIN);
			if (w > 0) {
				CHECK((size_t)w <= n);
				sent += (size_t)w;
				progress += (size_t)w;
			}
		}
		CHECK(gg_tls_engine_tx_pending(c) <= cap);
		progress += pump(c, s);
		size_t n = total - got < rchunk ? total - got : rchunk;
		ssize_t r = gg_tls_engine_read(s, dst + got, n);
		CHECK(r > 0 || r == -EAGAIN);
		if (r > 0) {
			got += (size_t)r;
			progress += (size_t)r;
		}
		stalls = progress ? 0 : stalls + 1;
		CHECK(stalls < 3);
	}
	CHECK(!memcmp(src, dst, total));
	CHECK_EQ_INT(dst[total], 0xa5);

	CHECK_EQ_INT(gg_tls_engine_shutdown(c), 0);
	pump(c, s);
	char tail;
	CHECK_EQ_INT(gg_tls_engine_read(s, &tail, 1), 0);
	CHECK_EQ_INT(gg_tls_engine_failure(s), GG_TLS_OK);
	CHECK_EQ_INT(gg_tls_engine_read(s, &tail, 1), 0);
	/* TLS 1.3 half-close: the side that sent close_notify still reads. */
	char reply[8];
	CHECK_EQ_INT(gg_tls_engine_write(s, "result", 6), 6);
	pump(s, c);
	CHECK_EQ_INT(gg_tls_engine_read(c, reply, sizeof(reply)), 6);
	CHECK(!memcmp(reply, "result", 6));
	free(src);
	free(dst);
	gg_tls_engine_free(c);
	gg_tls_engine_free(s);
	gg_tls_context_free(cctx);
	gg_tls_context_free(sctx);
}

static void test_truncation(void)
{
	struct gg_tls_context *cctx = make_ctx(ca, site_a_cert, NULL), *sctx = make_ctx(ca, site_b_cert, NULL);
	struct gg_tls_site want = site("site-b", "dns:site-b.gradgate.test");
	struct gg_tls_engine *c = make_engine(cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want, 1, 0);
	struct gg_tls_engine *s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, 0);
	char buf[8];

	struct outcome o = handshake(c, s);
	CHECK(o.client_rc == 0 && o.server_rc == 0);
	CHECK_EQ_INT(gg_tls_engine_write(c, "abc", 3), 3);
	pump(c, s);
	gg_tls_engine_rx_eof(s);
	CHECK_EQ_INT(gg_tls_engine_read(s, buf, sizeof(buf)), 3);
	CHECK_EQ_INT(gg_tls_engine_read(s, buf, sizeof(buf)), -ECONNRESET);
	CHECK_EQ_INT(gg_tls_engine_failure(s), GG_TLS_FAIL_CLOSED);
	CHECK_STR(gg_tls_engine_error(s), "peer 10.0.0.1:40000: connection closed without close_notify (data may be "
					  "truncated) (site site-a, dns:site-a.gradgate.test)");

	/* A flipped ciphertext bit is caught by the AEAD tag. */
	CHECK_EQ_INT(gg_tls_engine_write(s, "abc", 3), -ECONNRESET);
	gg_tls_engine_free(s);
	s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.1:40001", site_a_only, 1, 0);
	gg_tls_engine_free(c);
	c = make_engine(cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want, 1, 0);
	o = handshake(c, s);
	CHECK(o.client_rc == 0 && o.server_rc == 0);
	CHECK_EQ_INT(gg_tls_engine_write(c, "abcdef", 6), 6);
	const uint8_t *src;
	size_t n = gg_tls_engine_tx_data(c, &src);
	CHECK(n > 10);
	((uint8_t *)src)[7] ^= 1;
	pump(c, s);
	CHECK_EQ_INT(gg_tls_engine_read(s, buf, sizeof(buf)), -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(s), GG_TLS_FAIL_PROTOCOL);
	CHECK_CONTAINS(gg_tls_engine_error(s), "peer 10.0.0.1:40001: TLS failure: decryption failed or bad record mac");
	gg_tls_engine_free(c);
	gg_tls_engine_free(s);
	gg_tls_context_free(cctx);
	gg_tls_context_free(sctx);
}

static void test_bounded_rings(void)
{
	struct gg_tls_context *cctx = make_ctx(ca, site_a_cert, NULL), *sctx = make_ctx(ca, site_b_cert, NULL);
	struct gg_tls_site want = site("site-b", "dns:site-b.gradgate.test");
	struct gg_tls_engine *c = make_engine(cctx, GG_TLS_CLIENT, "10.0.0.2:7001", &want, 1, 1);
	struct gg_tls_engine *s = make_engine(sctx, GG_TLS_SERVER, "10.0.0.1:40000", site_a_only, 1, 1);
	static uint8_t big[1 << 20];
	uint8_t *dst;

	struct outcome o = handshake(c, s);
	CHECK(o.client_rc == 0 && o.server_rc == 0);
	ssize_t w = gg_tls_engine_write(c, big, sizeof(big));
	CHECK(w > 0 && (size_t)w < GG_TLS_RING_MIN_BYTES);
	CHECK_EQ_INT(w % GG_TLS_RECORD_PLAINTEXT_MAX, 0);
	CHECK_EQ_INT(gg_tls_engine_write(c, big, sizeof(big)), -EAGAIN);
	CHECK(gg_tls_engine_tx_pending(c) <= GG_TLS_RING_MIN_BYTES);
	/* Full records: 22 bytes of overhead each, nothing else. */
	CHECK_EQ_INT(gg_tls_engine_tx_pending(c), (size_t)w / GG_TLS_RECORD_PLAINTEXT_MAX * (GG_TLS_RECORD_PLAINTEXT_MAX + 22));
	pump(c, s);
	CHECK(gg_tls_engine_write(c, big, sizeof(big)) > 0);
	pump(c, s);
	CHECK_EQ_INT(gg_tls_engine_rx_space(s, &dst), 0);
	CHECK(gg_tls_engine_tx_pending(c) > 0);
	gg_tls_engine_free(c);
	gg_tls_engine_free(s);
	gg_tls_context_free(cctx);
	gg_tls_context_free(sctx);
}

int main(void)
{
	CHECK(gg_tls_pki_new("Test CA", &ca) == 0);
	CHECK(gg_tls_pki_new("Foreign CA", &foreign_ca) == 0);

	test_valid_pair();
	test_uri_identity();
	test_server_wrong_identity();
	test_client_wrong_identity();
	test_denied_site();
	test_common_name_not_trusted();
	test_unknown_ca();
	test_not_yet_valid();
	test_usage();
	test_two_identities();
	test_no_common_suite();
	test_no_common_group();
	test_garbage_and_eof();
	test_truncation();
	test_bounded_rings();

	static const size_t sizes[] = { 1, 7, 16383, 16384, 16385, 65536 + 3, 1000003 };
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		transfer(sizes[i], sizes[i], sizes[i], 0);
		transfer(sizes[i], 4097, 333, 0);
		transfer(sizes[i], 1 << 20, 100000, 1);
	}

	gg_tls_pki_free(ca);
	gg_tls_pki_free(foreign_ca);
	printf("test_tls_engine: ok\n");
	return 0;
}
