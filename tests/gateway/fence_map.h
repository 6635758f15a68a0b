/* Memory that code under test may not touch: one memfd mapped twice,
 * without access at *fence (what the code is given) and read-write at
 * *alias (where the test reaches the same bytes). A direct read or write
 * of *fence faults. For tests of code that must reach memory only through
 * its ops, as it would a GPU's. */
#ifndef GG_FENCE_MAP_H
#define GG_FENCE_MAP_H

#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>

/* Maps whole pages holding more than `bytes`; their size goes into *size.
 * Returns 0, or -1 with nothing mapped. */
static inline int fence_map(size_t bytes, void **fence, void **alias, size_t *size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int fd = memfd_create("fenced", 0);
	void *f = MAP_FAILED, *a = MAP_FAILED;

	*size = (bytes / page + 1) * page;
	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)*size) == 0) {
		f = mmap(NULL, *size, PROT_NONE, MAP_SHARED, fd, 0);
		a = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	}
	close(fd);
	if (f == MAP_FAILED || a == MAP_FAILED) {
		if (f != MAP_FAILED)
			munmap(f, *size);
		if (a != MAP_FAILED)
			munmap(a, *size);
		return -1;
	}
	*fence = f;
	*alias = a;
	return 0;
}

static inline void fence_unmap(void *fence, void *alias, size_t size)
{
	munmap(fence, size);
	munmap(alias, size);
}

#endif
