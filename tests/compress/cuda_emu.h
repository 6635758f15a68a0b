/* Enough of CUDA's execution model to run cuda/codec_kernels.cuh on a CPU.
 * A launch runs the warps of the grid one after the other; the 32 lanes of
 * a warp are fibers (ucontext) that take turns, each running until it
 * reaches a __shfl_xor_sync or leaves the kernel. A shuffle completes when
 * all 32 lanes are at it with the same mask and lane mask, as on a GPU. A
 * lane that leaves the kernel while others wait at a shuffle, or lanes
 * that disagree on a shuffle's arguments, fail the test: on a GPU that is
 * undefined behaviour. Memory is the host's; the arithmetic is the host
 * path of codec_elem.h (the device intrinsics run only on a GPU). */
#ifndef GG_CUDA_EMU_H
#define GG_CUDA_EMU_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define __global__
#define __device__
#define __launch_bounds__(threads)

typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };

struct emu_dim3 {
	unsigned x, y, z;
};
static emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline uint32_t max(uint32_t a, uint32_t b)
{
	return a > b ? a : b;
}

enum emu_lane_state { EMU_READY, EMU_AT_SHUFFLE, EMU_DONE };

struct emu_lane {
	ucontext_t ctx;
	std::vector<char> stack;
	emu_lane_state state;
	unsigned mask, value, result;
	int lane_mask;
};

static struct {
	emu_lane lanes[32];
	ucontext_t scheduler;
	int current;
	unsigned warp; /* of the warp running */
	const std::function<void()> *body;
	unsigned long long warps, shuffles;
} emu;

static void emu_fail(const char *what, unsigned block, unsigned warp)
{
	fprintf(stderr, "cuda emulation: block %u, warp %u: %s\n", block, warp, what);
	exit(1);
}

/* The lane running stops (at a shuffle, or done) and the next one runs,
 * or after the last the scheduler: a round of the warp switches contexts
 * 33 times, not 64. Each round every lane is ready. */
static void emu_next_lane(emu_lane &l)
{
	if (emu.current == 31) {
		swapcontext(&l.ctx, &emu.scheduler);
		return;
	}
	emu.current++;
	threadIdx.x = emu.warp * 32 + (unsigned)emu.current;
	swapcontext(&l.ctx, &emu.lanes[emu.current].ctx);
}

/* A lane's fiber runs the kernel once per warp it stands for: made once,
 * it takes each warp up where it left the last, which spares a context
 * made and a return through uc_link per lane and warp. */
static void emu_lane_main(void)
{
	for (;;) {
		(*emu.body)();
		emu_lane &l = emu.lanes[emu.current];
		l.state = EMU_DONE;
		emu_next_lane(l);
	}
}

/* getcontext() returns twice: kept out of emu_run_warp's loop. */
static __attribute__((noinline)) void emu_lane_make(emu_lane &l)
{
	l.stack.resize(256 << 10);
	getcontext(&l.ctx);
	l.ctx.uc_stack.ss_sp = l.stack.data();
	l.ctx.uc_stack.ss_size = l.stack.size();
	l.ctx.uc_link = NULL; /* emu_lane_main never returns */
	makecontext(&l.ctx, emu_lane_main, 0);
}

static unsigned __shfl_xor_sync(unsigned mask, unsigned value, int lane_mask)
{
	emu_lane &l = emu.lanes[emu.current];

	l.mask = mask;
	l.value = value;
	l.lane_mask = lane_mask;
	l.state = EMU_AT_SHUFFLE;
	emu_next_lane(l);
	return l.result;
}

static void emu_run_warp(unsigned block, unsigned warp)
{
	for (int i = 0; i < 32; i++) {
		if (emu.lanes[i].stack.empty())
			emu_lane_make(emu.lanes[i]);
		emu.lanes[i].state = EMU_READY;
	}
	for (;;) {
		int waiting = 0;
		emu.current = 0;
		emu.warp = warp;
		threadIdx.x = warp * 32;
		blockIdx.x = block;
		swapcontext(&emu.scheduler, &emu.lanes[0].ctx);
		for (int i = 0; i < 32; i++)
			waiting += emu.lanes[i].state == EMU_AT_SHUFFLE;
		if (waiting == 0)
			break;
		if (waiting != 32)
			emu_fail("some lanes wait at __shfl_xor_sync while others left the kernel", block, warp);
		for (int i = 0; i < 32; i++) {
			const emu_lane &l = emu.lanes[i];
			if (l.mask != 0xffffffffu || l.lane_mask != emu.lanes[0].lane_mask || l.lane_mask < 0 ||
			    l.lane_mask > 31)
				emu_fail("lanes disagree on a shuffle's mask or lane mask", block, warp);
		}
		for (int i = 0; i < 32; i++) {
			emu.lanes[i].result = emu.lanes[i ^ emu.lanes[i].lane_mask].value;
			emu.lanes[i].state = EMU_READY;
		}
		emu.shuffles++;
	}
	emu.warps++;
}

/* What codec_kernels.cuh calls to launch: runs the whole grid now. */
template <typename... P, typename... A>
static cudaError_t gg_launch(void (*kernel)(P...), unsigned blocks, unsigned threads, cudaStream_t, A... args)
{
	std::function<void()> body = [&] { kernel(static_cast<P>(args)...); };

	if (blocks == 0 || threads == 0 || threads % 32)
		emu_fail("launch shape must be whole warps", blocks, threads);
	emu.body = &body;
	gridDim = { blocks, 1, 1 };
	blockDim = { threads, 1, 1 };
	for (unsigned b = 0; b < blocks; b++)
		for (unsigned w = 0; w < threads / 32; w++)
			emu_run_warp(b, w);
	return cudaSuccess;
}

#endif
