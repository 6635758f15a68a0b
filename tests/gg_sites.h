/* Configuration of test meshes: sites s0..s(K-1) on loopback ports, with
 * the certificates examples/make-certs.sh makes for them. */
#ifndef GG_SITES_H
#define GG_SITES_H

#include <stdio.h>

/* Writes the [site], [tls] and [[peers]] tables of site s`k` into text,
 * with dial[p] as its dial setting for peer p (NULL, or a NULL entry: the
 * default) and peer_ports[p] as the port it dials p on (NULL: ports[p]);
 * returns the length of the text (less than size when it fit). */
static inline size_t gg_test_site_toml_dial(char *text, size_t size, unsigned k, unsigned K, const int *ports,
					    unsigned threads, const char *cert_dir, const char *const *dial,
					    const int *peer_ports)
{
	int n = snprintf(text, size,
			 "[site]\nname = \"s%u\"\nlisten = \"127.0.0.1:%d\"\nthreads = %u\n"
			 "[tls]\nca = \"%s/ca.pem\"\ncert = \"%s/s%u.pem\"\nkey = \"%s/s%u.key\"\n",
			 k, ports[k], threads, cert_dir, cert_dir, k, cert_dir, k);

	for (unsigned p = 0; p < K && n > 0 && (size_t)n < size; p++)
		if (p != k)
			n += snprintf(text + n, size - (size_t)n,
				      "[[peers]]\nsite = \"s%u\"\naddress = \"127.0.0.1:%d\"\n"
				      "identity = \"dns:s%u.gradgate.test\"\n%s%s%s",
				      p, peer_ports ? peer_ports[p] : ports[p], p, dial && dial[p] ? "dial = \"" : "",
				      dial && dial[p] ? dial[p] : "", dial && dial[p] ? "\"\n" : "");
	return n > 0 ? (size_t)n : 0;
}

/* The same with the default dial setting and ports. */
static inline size_t gg_test_site_toml(char *text, size_t size, unsigned k, unsigned K, const int *ports,
				       unsigned threads, const char *cert_dir)
{
	return gg_test_site_toml_dial(text, size, k, K, ports, threads, cert_dir, NULL, NULL);
}

#endif
