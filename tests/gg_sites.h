/* Configuration of test meshes: sites s0..s(K-1) on loopback ports, with
 * the certificates examples/make-certs.sh makes for them. */
#ifndef GG_SITES_H
#define GG_SITES_H

#include <stdio.h>

/* Writes the [site], [tls] and [[peers]] tables of site s`k` into text;
 * returns the length of the text (less than size when it fit). */
static inline size_t gg_test_site_toml(char *text, size_t size, unsigned k, unsigned K, const int *ports,
				       unsigned threads, const char *cert_dir)
{
	int n = snprintf(text, size,
			 "[site]\nname = \"s%u\"\nlisten = \"127.0.0.1:%d\"\nthreads = %u\n"
			 "[tls]\nca = \"%s/ca.pem\"\ncert = \"%s/s%u.pem\"\nkey = \"%s/s%u.key\"\n",
			 k, ports[k], threads, cert_dir, cert_dir, k, cert_dir, k);

	for (unsigned p = 0; p < K && n > 0 && (size_t)n < size; p++)
		if (p != k)
			n += snprintf(text + n, size - (size_t)n,
				      "[[peers]]\nsite = \"s%u\"\naddress = \"127.0.0.1:%d\"\n"
				      "identity = \"dns:s%u.gradgate.test\"\n",
				      p, ports[p], p);
	return n > 0 ? (size_t)n : 0;
}

#endif
