#include "tls_pki.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "tls_verify.h"

struct gg_tls_pki {
	EVP_PKEY *key;
	X509 *cert;
	char *pem;
};

static char *bio_to_string(BIO *bio)
{
	char *data;
	long len = BIO_get_mem_data(bio, &data);
	char *s = len >= 0 ? malloc((size_t)len + 1) : NULL;

	if (s) {
		memcpy(s, data, (size_t)len);
		s[len] = '\0';
	}
	return s;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX v3;
	X509_EXTENSION *ext;

	X509V3_set_ctx(&v3, issuer, cert, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
	if (!ext)
		return -EINVAL;
	int ok = X509_add_ext(cert, ext, -1);
	X509_EXTENSION_free(ext);
	return ok ? 0 : -ENOMEM;
}

/* Appends identity `id` to `names`. Returns 0 or -ENOMEM. */
static int push_name(GENERAL_NAMES *names, const struct gg_tls_identity *id)
{
	GENERAL_NAME *gn = GENERAL_NAME_new();
	ASN1_IA5STRING *s = ASN1_IA5STRING_new();

	if (!gn || !s || !ASN1_STRING_set(s, id->name, (int)strlen(id->name))) {
		ASN1_IA5STRING_free(s);
		GENERAL_NAME_free(gn);
		return -ENOMEM;
	}
	GENERAL_NAME_set0_value(gn, id->kind == GG_TLS_IDENTITY_DNS ? GEN_DNS : GEN_URI, s);
	if (!sk_GENERAL_NAME_push(names, gn)) {
		GENERAL_NAME_free(gn);
		return -ENOMEM;
	}
	return 0;
}

static int add_san(X509 *cert, const struct gg_tls_identity *id, const struct gg_tls_identity *also)
{
	GENERAL_NAMES *names = sk_GENERAL_NAME_new_null();
	int rc = -ENOMEM;

	if (names && !push_name(names, id) && (!also || !push_name(names, also)) &&
	    X509_add1_ext_i2d(cert, NID_subject_alt_name, names, 0, X509V3_ADD_DEFAULT) == 1)
		rc = 0;
	GENERAL_NAMES_free(names);
	return rc;
}

/* An unsigned certificate for `key`, named CN=<cn>, issued by `issuer` (or
 * by itself when issuer is NULL). */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, long from_s, long until_s)
{
	X509 *cert = X509_new();
	BIGNUM *serial = BN_new();
	X509 *ret = NULL;

	if (!cert || !serial || !X509_set_version(cert, X509_VERSION_3) || !BN_rand(serial, 63, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
	    !BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert)) ||
	    !X509_gmtime_adj(X509_getm_notBefore(cert), from_s) || !X509_gmtime_adj(X509_getm_notAfter(cert), until_s) ||
	    !X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0) ||
	    !X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : X509_get_subject_name(cert)) ||
	    !X509_set_pubkey(cert, key))
		goto out;
	ret = cert;
	cert = NULL;
out:
	BN_free(serial);
	X509_free(cert);
	return ret;
}

int gg_tls_pki_new(const char *ca_name, struct gg_tls_pki **out)
{
	struct gg_tls_pki *pki = calloc(1, sizeof(*pki));
	BIO *bio = BIO_new(BIO_s_mem());
	int rc = -ENOMEM;

	*out = NULL;
	if (!pki || !bio || !(pki->key = EVP_EC_gen("P-256")) ||
	    !(pki->cert = make_cert(pki->key, ca_name, NULL, -3600, 86400)))
		goto out;
	rc = -EINVAL;
	if (add_ext(pki->cert, pki->cert, NID_basic_constraints, "critical,CA:TRUE") ||
	    add_ext(pki->cert, pki->cert, NID_key_usage, "critical,keyCertSign,cRLSign") ||
	    add_ext(pki->cert, pki->cert, NID_subject_key_identifier, "hash") ||
	    !X509_sign(pki->cert, pki->key, EVP_sha256()) || !PEM_write_bio_X509(bio, pki->cert) ||
	    !(pki->pem = bio_to_string(bio)))
		goto out;
	*out = pki;
	pki = NULL;
	rc = 0;
out:
	BIO_free(bio);
	gg_tls_pki_free(pki);
	ERR_clear_error();
	return rc;
}

void gg_tls_pki_free(struct gg_tls_pki *pki)
{
	if (!pki)
		return;
	EVP_PKEY_free(pki->key);
	X509_free(pki->cert);
	free(pki->pem);
	free(pki);
}

const char *gg_tls_pki_ca_pem(const struct gg_tls_pki *pki)
{
	return pki->pem;
}

int gg_tls_pki_issue(struct gg_tls_pki *pki, const struct gg_tls_cert_request *req, char **cert_pem, char **key_pem)
{
	struct gg_tls_identity id, also;
	const char *why;
	char eku[32] = "";
	EVP_PKEY *key = NULL;
	X509 *cert = NULL;
	BIO *cbio = NULL, *kbio = NULL;
	int rc = -EINVAL;

	*cert_pem = *key_pem = NULL;
	if (gg_tls_identity_parse(req->identity, &id, &why) ||
	    (req->also && gg_tls_identity_parse(req->also, &also, &why)))
		goto out;
	strcat(eku, req->no_server_auth ? "" : "serverAuth");
	if (!req->no_client_auth)
		strcat(eku, eku[0] ? ",clientAuth" : "clientAuth");
	rc = -ENOMEM;
	if (!(key = EVP_EC_gen("P-256")) || !(cbio = BIO_new(BIO_s_mem())) || !(kbio = BIO_new(BIO_s_mem())) ||
	    !(cert = make_cert(key, req->common_name ? req->common_name : id.name, pki->cert, req->valid_from_s,
			       req->valid_until_s ? req->valid_until_s : 86400)))
		goto out;
	rc = -EINVAL;
	if (add_ext(cert, pki->cert, NID_basic_constraints, req->ca ? "critical,CA:TRUE" : "critical,CA:FALSE") ||
	    add_ext(cert, pki->cert, NID_key_usage,
		    req->no_signature ? "critical,keyEncipherment" : "critical,digitalSignature") ||
	    (eku[0] && add_ext(cert, pki->cert, NID_ext_key_usage, eku)) ||
	    add_ext(cert, pki->cert, NID_authority_key_identifier, "keyid") || add_san(cert, &id, req->also ? &also : NULL) ||
	    !X509_sign(cert, pki->key, EVP_sha256()) || !PEM_write_bio_X509(cbio, cert) ||
	    !PEM_write_bio_PrivateKey(kbio, key, NULL, NULL, 0, NULL, NULL))
		goto out;
	rc = -ENOMEM;
	*cert_pem = bio_to_string(cbio);
	*key_pem = bio_to_string(kbio);
	if (!*cert_pem || !*key_pem) {
		free(*cert_pem);
		free(*key_pem);
		*cert_pem = *key_pem = NULL;
		goto out;
	}
	rc = 0;
out:
	BIO_free(cbio);
	BIO_free(kbio);
	X509_free(cert);
	EVP_PKEY_free(key);
	ERR_clear_error();
	return rc;
}
