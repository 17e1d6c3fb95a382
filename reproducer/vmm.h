/* SPDX-License-Identifier: GPL-2.0-only */
/* The tracekit VMM: guest memory layout, guest image, VM and its parameters. */
#ifndef TRACEKIT_VMM_H
#define TRACEKIT_VMM_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common.h"
#include "knobset.h"
#include "stopsig.h"

/* The guest memory layout; guests/guest.h holds the same numbers for the assembly. */
#define RAM_BASE		0x40000000ull
#define MARKER_OFFSET		0x100000ull	/* RAM + 1 MiB: one 8-byte marker per vCPU */
#define TOUCH_OFFSET		0x200000ull	/* RAM + 2 MiB: cache-toggle slices */
#define DOORBELL_DONE		0x3f000000ull	/* MMIO write: a secondary vCPU is done */
#define DOORBELL_BARRIER	0x3f000008ull	/* MMIO write: vCPU 0 waits for the others */
#define NT_TRACEKIT_VARIANT	0x544b0001u
#define MAX_VCPUS		512
#define MAX_IPA_LIST		32
#define MAX_KNOB_ARGS		64

/* One PT_LOAD segment of the guest image, as it will be copied into guest RAM. */
struct guest_segment {
	uint64_t ipa;
	uint64_t file_size;
	uint64_t mem_size;
	const unsigned char *data;
};

/* A guest ELF read into memory: its segments, entry point and variant note. */
struct guest_image {
	const char *path;
	unsigned char *file;
	size_t file_size;
	uint64_t entry;
	int nsegments;
	struct guest_segment segments[16];
	char variant[64];
	uint64_t marker;
	int knob_layout;		/* note key knobs=; 0: an old guest without a block */
	char preset[64];		/* note key preset= ("none" for an old guest) */
	char revision[16];		/* note key revision= ("unknown" for an old guest) */
	struct knob_block defaults;	/* the preset's block, as linked at KNOB_BASE */
};

/* How guest RAM is backed (--backing); each choice aligns and madvises it. */
enum backing {
	BACKING_DEFAULT,		/* a plain anonymous mapping, as before --backing */
	BACKING_4K,			/* MADV_NOHUGEPAGE: stage 2 gets 4 KiB pages */
	BACKING_THP,			/* 2 MiB aligned, MADV_HUGEPAGE */
	BACKING_HUGETLB,		/* MAP_HUGETLB (default huge page size) */
};

/* Everything the command line chose; shared by all VMs of a --repeat run. */
struct vmm_options {
	const char *guest_path;
	uint64_t ram_bytes;
	int vcpus;
	struct cpu_list cpus;		/* count 0: no pinning */
	int ipa_bits[MAX_IPA_LIST];	/* 0: KVM's default (40 bits) */
	int ipa_count;
	uint64_t tlbi_count;
	uint64_t spin_us;
	uint64_t spin_ticks;
	uint64_t touch_bytes;
	uint64_t repeat;
	uint64_t timeout_s;		/* 0: no watchdog */
	clockid_t clock;
	int trace_fd;			/* -1: no trace markers */
	bool tlbi_count_set, touch_set, spin_set;	/* given on the command line */
	const char *preset;		/* --preset, or NULL: the guest's own */
	const char *knob_args[MAX_KNOB_ARGS];	/* --knob NAME=VALUE, in order */
	int knob_count;
	const char *dump_knobs;		/* --dump-knobs FILE: write the block, run nothing */
	enum backing backing;
	bool knobbed;			/* the guest has a knob block: KNOBS is what it gets */
	bool hold_vm;			/* --hold-vm: one idle VM open for the whole series */
	struct knob_block knobs;
};

/* How one VM ended: an exit code and its one-line message, or stopped on request. */
struct vm_result {
	int code;
	bool stopped;			/* SIGTERM/SIGINT ended its run; torn down in full */
	bool has_results;		/* a knob guest: RESULTS holds vCPU 0's result words */
	uint64_t results[6];		/* RW_* of guests/knobs.h */
	char message[512];
};


/* The durations of one VM's phases, in ns of the chosen clock. */
struct vm_timing {
	uint64_t create_start;
	uint64_t create_ns;
	uint64_t run_ns;
	uint64_t teardown_ns;
	uint64_t teardown_end;
	/* Ground-truth sync markers: before creation, vCPU 0's first entry, teardown. */
	struct gt_sync create_sync;
	struct gt_sync run_sync;
	struct gt_sync teardown_sync;
};

/* The host's KVM: the /dev/kvm fd and the limits the VMM checks options against. */
struct kvm_host {
	int fd;
	int max_ipa_bits;		/* KVM_CAP_ARM_VM_IPA_SIZE (0: fixed 40 bits) */
	int max_vcpus;
	size_t run_size;		/* KVM_GET_VCPU_MMAP_SIZE */
};

/* Read and check the guest ELF (dies with EXIT_BAD_GUEST). */
void guest_load_file(const char *path, uint64_t ram_bytes, struct guest_image *image);

/* Copy the guest's PT_LOAD segments into RAM mapped at HOST. */
void guest_copy_to_ram(const struct guest_image *image, unsigned char *host);

/* The name of a backing choice, as --backing takes it. */
const char *backing_name(enum backing backing);

/* Open /dev/kvm and read its limits (dies with EXIT_NO_KVM / EXIT_SYSTEM). */
void kvm_host_open(struct kvm_host *host);

/* Create, run and tear down one VM; fills TIMING, returns how it ended. */
struct vm_result vm_run_one(const struct kvm_host *host, const struct vmm_options *opts,
			    const struct guest_image *image, int index, int ipa_bits,
			    struct vm_timing *timing);

#endif /* TRACEKIT_VMM_H */
