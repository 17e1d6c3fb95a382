// SPDX-License-Identifier: GPL-2.0-only
/*
 * One VM's life: create (VM, RAM, memslot, vCPUs), run (one thread per vCPU, the
 * doorbell protocol, PSCI SYSTEM_OFF), check the markers, tear down.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm.h"

#define CORE_REG(field) \
	(KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | \
	 (offsetof(struct kvm_regs, field) / sizeof(uint32_t)))

/* One vCPU: its fd, shared run page, thread and where it is pinned. */
struct vcpu {
	struct vm *vm;
	int index;
	int fd;
	int cpu;			/* -1: not pinned */
	struct kvm_run *run;
	pthread_t thread;
	bool started;
	bool finished;
	struct gt_sync sync;		/* the sync marker at its first entry (on its CPU) */
};

/* One VM and the state its vCPU threads share under LOCK. */
struct vm {
	const struct kvm_host *host;
	const struct vmm_options *opts;
	const struct guest_image *image;
	int index;
	int fd;
	unsigned char *ram;		/* guest RAM (aligned inside MAP when --backing thp) */
	void *map;			/* the mapping to unmap, MAP_BYTES long */
	uint64_t map_bytes;
	struct vcpu vcpus[MAX_VCPUS];
	int nvcpus;
	pthread_mutex_t lock;
	pthread_cond_t changed;
	int finished;			/* vCPU threads that have returned */
	int secondaries_done;		/* secondaries that rang DOORBELL_DONE */
	bool stopping;			/* failure or timeout: every thread must return */
	bool powered_off;
	uint64_t poweroff_at;
	int fail_errno;			/* errno when the first failure was recorded */
	struct vm_result result;
};

/* Record the VM's first failure (later ones are consequences) and ask all to stop. */
static void vm_fail(struct vm *vm, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void vm_fail(struct vm *vm, int code, const char *fmt, ...)
{
	int err = errno;	/* before anything below can change it */
	va_list ap;

	pthread_mutex_lock(&vm->lock);
	if (!vm->result.code) {
		vm->result.code = code;
		vm->fail_errno = err;
		va_start(ap, fmt);
		vsnprintf(vm->result.message, sizeof(vm->result.message), fmt, ap);
		va_end(ap);
	}
	__atomic_store_n(&vm->stopping, true, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&vm->changed);
	pthread_mutex_unlock(&vm->lock);
}

/* Read the stop flag outside the lock (vCPU threads poll it between KVM_RUNs). */
static bool is_stopping(struct vm *vm)
{
	return __atomic_load_n(&vm->stopping, __ATOMIC_ACQUIRE);
}

/* Open /dev/kvm and read the capabilities the VMM needs. */
void kvm_host_open(struct kvm_host *host)
{
	int version;

	host->fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (host->fd < 0 && errno == ENOENT)
		die(EXIT_NO_KVM, "KVM is not available: /dev/kvm does not exist (the kernel was "
		    "not booted at EL2, or has no KVM, e.g. Debian's rt flavour)");
	if (host->fd < 0)
		die(EXIT_NO_KVM, "KVM is not available: cannot open /dev/kvm: %s (run as root or "
		    "as a member of the kvm group)", strerror(errno));
	version = ioctl(host->fd, KVM_GET_API_VERSION, 0);
	if (version < 0)
		die(EXIT_NO_KVM, "KVM is not available: /dev/kvm does not answer "
		    "KVM_GET_API_VERSION (%s); is this an arm64 host with KVM?", strerror(errno));
	if (version != KVM_API_VERSION)
		die(EXIT_NO_KVM, "KVM API version %d, expected %d", version, KVM_API_VERSION);
	if (ioctl(host->fd, KVM_CHECK_EXTENSION, KVM_CAP_ARM_PSCI_0_2) <= 0)
		die(EXIT_NO_KVM, "this KVM lacks PSCI 0.2 (KVM_CAP_ARM_PSCI_0_2), which guests "
		    "use to power off");
	if (ioctl(host->fd, KVM_CHECK_EXTENSION, KVM_CAP_IMMEDIATE_EXIT) <= 0)
		die(EXIT_NO_KVM, "this KVM lacks KVM_CAP_IMMEDIATE_EXIT (kernel too old)");
	host->max_ipa_bits = ioctl(host->fd, KVM_CHECK_EXTENSION, KVM_CAP_ARM_VM_IPA_SIZE);
	if (host->max_ipa_bits < 0)
		host->max_ipa_bits = 0;
	host->max_vcpus = ioctl(host->fd, KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS);
	if (host->max_vcpus <= 0)
		host->max_vcpus = 1;
	host->run_size = ioctl(host->fd, KVM_GET_VCPU_MMAP_SIZE, 0);
	if ((long)host->run_size <= 0)
		die(EXIT_SYSTEM, "KVM_GET_VCPU_MMAP_SIZE: %s", strerror(errno));
}

/* Write one 64-bit core register of a vCPU; false on failure. */
static bool set_core_reg(int fd, uint64_t id, uint64_t value)
{
	struct kvm_one_reg reg = { .id = id, .addr = (uint64_t)(uintptr_t)&value };

	return ioctl(fd, KVM_SET_ONE_REG, &reg) == 0;
}

/* Read a vCPU's PC for error messages (0 if it cannot be read). */
static uint64_t vcpu_pc(const struct vcpu *vcpu)
{
	uint64_t pc = 0;
	struct kvm_one_reg reg = { .id = CORE_REG(regs.pc), .addr = (uint64_t)(uintptr_t)&pc };

	if (vcpu->fd >= 0)
		ioctl(vcpu->fd, KVM_GET_ONE_REG, &reg);
	return pc;
}

/* Create vCPU I: PSCI 0.2, PC at the entry, x0-x4 the run parameters. */
static bool vcpu_create(struct vm *vm, int i)
{
	const struct vmm_options *opts = vm->opts;
	struct vcpu *vcpu = &vm->vcpus[i];
	struct kvm_vcpu_init init;
	uint64_t args[5] = { i, opts->tlbi_count, opts->spin_ticks, opts->touch_bytes,
			     opts->vcpus };

	vcpu->vm = vm;
	vcpu->index = i;
	vcpu->cpu = opts->cpus.count ? opts->cpus.cpus[i % opts->cpus.count] : -1;
	vcpu->fd = ioctl(vm->fd, KVM_CREATE_VCPU, i);
	if (vcpu->fd < 0) {
		vm_fail(vm, EXIT_SYSTEM, "KVM_CREATE_VCPU %d: %s", i, strerror(errno));
		return false;
	}
	vm->nvcpus = i + 1;
	if (ioctl(vm->fd, KVM_ARM_PREFERRED_TARGET, &init) < 0) {
		vm_fail(vm, EXIT_SYSTEM, "KVM_ARM_PREFERRED_TARGET: %s", strerror(errno));
		return false;
	}
	init.features[0] |= 1u << KVM_ARM_VCPU_PSCI_0_2;
	if (ioctl(vcpu->fd, KVM_ARM_VCPU_INIT, &init) < 0) {
		vm_fail(vm, EXIT_SYSTEM, "KVM_ARM_VCPU_INIT %d: %s", i, strerror(errno));
		return false;
	}
	for (int r = 0; r < 5; r++)
		if (!set_core_reg(vcpu->fd, CORE_REG(regs.regs[r]), args[r]))
			goto reg_error;
	if (!set_core_reg(vcpu->fd, CORE_REG(regs.pc), vm->image->entry))
		goto reg_error;
	vcpu->run = mmap(NULL, vm->host->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu->fd,
			 0);
	if (vcpu->run == MAP_FAILED) {
		vcpu->run = NULL;
		vm_fail(vm, EXIT_SYSTEM, "mmap of vCPU %d's kvm_run: %s", i, strerror(errno));
		return false;
	}
	return true;
reg_error:
	vm_fail(vm, EXIT_SYSTEM, "KVM_SET_ONE_REG on vCPU %d: %s", i, strerror(errno));
	return false;
}

const char *backing_name(enum backing backing)
{
	static const char *const names[] = { "default", "4k", "thp", "hugetlb" };

	return names[backing];
}

#define HUGE_2M (2ull << 20)

/* Map guest RAM as --backing asks; false (result set) on failure. */
static bool map_ram(struct vm *vm)
{
	enum backing backing = vm->opts->backing;
	uint64_t bytes = vm->opts->ram_bytes;
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	uintptr_t start;

	/* hugetlb: no MAP_NORESERVE, so a shortage of huge pages fails here, not later. */
	if (backing == BACKING_HUGETLB)
		flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
	/* thp: 2 MiB more, to start RAM on a 2 MiB boundary (stage 2 can then use blocks). */
	vm->map_bytes = bytes + (backing == BACKING_THP ? HUGE_2M : 0);
	vm->map = mmap(NULL, vm->map_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (vm->map == MAP_FAILED) {
		vm->map = NULL;
		if (backing == BACKING_HUGETLB)
			vm_fail(vm, EXIT_SYSTEM, "--backing hugetlb: cannot map %llu MiB of huge "
				"pages (%s); reserve them first, e.g. echo %llu > "
				"/proc/sys/vm/nr_hugepages", (unsigned long long)(bytes >> 20),
				strerror(errno), (unsigned long long)(bytes / HUGE_2M));
		else
			vm_fail(vm, EXIT_SYSTEM, "mmap of %llu bytes of guest RAM: %s",
				(unsigned long long)bytes, strerror(errno));
		return false;
	}
	start = (uintptr_t)vm->map;
	if (backing == BACKING_THP)
		start = (start + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1);
	vm->ram = (unsigned char *)start;
	if ((backing == BACKING_4K && madvise(vm->ram, bytes, MADV_NOHUGEPAGE)) ||
	    (backing == BACKING_THP && madvise(vm->ram, bytes, MADV_HUGEPAGE))) {
		vm_fail(vm, EXIT_SYSTEM, "--backing %s: madvise: %s (is THP built into this "
			"kernel?)", backing_name(backing), strerror(errno));
		return false;
	}
	return true;
}

/* Copy the guest, and for a knob guest its block and stage-1 tables, into RAM. */
static void fill_ram(struct vm *vm)
{
	const struct vmm_options *opts = vm->opts;

	guest_copy_to_ram(vm->image, vm->ram);
	if (!opts->knobbed)
		return;
	memcpy(vm->ram + (KNOB_BASE - RAM_BASE), opts->knobs.w, KNOB_BYTES);
	knobs_write_tables(&opts->knobs, vm->ram, opts->ram_bytes);
}

/* Create the VM with its RAM, memslot and vCPUs; false (result set) on failure. */
static bool vm_create(struct vm *vm, int ipa_bits)
{
	/* Without KVM_CAP_ARM_VM_IPA_SIZE only type 0 (40 bits) exists; options allow just 40. */
	unsigned long type = ipa_bits && vm->host->max_ipa_bits ?
		KVM_VM_TYPE_ARM_IPA_SIZE(ipa_bits) : 0;
	struct kvm_userspace_memory_region region;

	vm->fd = ioctl(vm->host->fd, KVM_CREATE_VM, type);
	if (vm->fd < 0) {
		vm_fail(vm, EXIT_SYSTEM, "KVM_CREATE_VM (IPA %d bits): %s", ipa_bits ? ipa_bits : 40,
			strerror(errno));
		return false;
	}
	if (!map_ram(vm))
		return false;
	fill_ram(vm);
	region = (struct kvm_userspace_memory_region){
		.slot = 0,
		.guest_phys_addr = RAM_BASE,
		.memory_size = vm->opts->ram_bytes,
		.userspace_addr = (uint64_t)(uintptr_t)vm->ram,
	};
	if (ioctl(vm->fd, KVM_SET_USER_MEMORY_REGION, &region) < 0) {
		vm_fail(vm, EXIT_SYSTEM, "KVM_SET_USER_MEMORY_REGION: %s", strerror(errno));
		return false;
	}
	for (int i = 0; i < vm->opts->vcpus; i++)
		if (!vcpu_create(vm, i))
			return false;
	return true;
}

/* vCPU 0 at the barrier: wait until every secondary rang "done" (or the VM stops). */
static void wait_for_secondaries(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	while (vm->secondaries_done < vm->nvcpus - 1 && !vm->stopping)
		pthread_cond_wait(&vm->changed, &vm->lock);
	pthread_mutex_unlock(&vm->lock);
}

/* Handle an MMIO exit; returns true when the vCPU should be entered again. */
static bool handle_mmio(struct vcpu *vcpu)
{
	struct vm *vm = vcpu->vm;
	struct kvm_run *run = vcpu->run;
	uint64_t addr = run->mmio.phys_addr;

	if (run->mmio.is_write && addr == DOORBELL_DONE && vcpu->index != 0) {
		pthread_mutex_lock(&vm->lock);
		vm->secondaries_done++;
		pthread_cond_broadcast(&vm->changed);
		pthread_mutex_unlock(&vm->lock);
		return false;
	}
	if (run->mmio.is_write && addr == DOORBELL_BARRIER && vcpu->index == 0) {
		wait_for_secondaries(vm);
		return !is_stopping(vm);
	}
	vm_fail(vm, EXIT_UNEXPECTED, "vm %d vCPU %d: unexpected MMIO %s at 0x%llx, PC 0x%llx",
		vm->index, vcpu->index, run->mmio.is_write ? "write" : "read",
		(unsigned long long)addr, (unsigned long long)vcpu_pc(vcpu));
	return false;
}

/* Handle a system event: SYSTEM_OFF from vCPU 0 ends the run. */
static void handle_system_event(struct vcpu *vcpu)
{
	struct vm *vm = vcpu->vm;

	if (vcpu->run->system_event.type == KVM_SYSTEM_EVENT_SHUTDOWN) {
		pthread_mutex_lock(&vm->lock);
		vm->powered_off = true;
		vm->poweroff_at = now_ns(vm->opts->clock);
		pthread_mutex_unlock(&vm->lock);
		trace_marker(vm->opts->trace_fd, "tracekit-vmm: vm=%d event=poweroff vcpu=%d",
			     vm->index, vcpu->index);
		return;
	}
	vm_fail(vm, EXIT_UNEXPECTED, "vm %d vCPU %d: unexpected system event %u (not "
		"SYSTEM_OFF), PC 0x%llx", vm->index, vcpu->index, vcpu->run->system_event.type,
		(unsigned long long)vcpu_pc(vcpu));
}

/* Run one vCPU until it is done, powers the VM off, fails or is stopped. */
static void vcpu_loop(struct vcpu *vcpu)
{
	struct vm *vm = vcpu->vm;

	for (;;) {
		if (ioctl(vcpu->fd, KVM_RUN, 0) < 0) {
			/* A stop request returns at once; the main thread then kicks the rest. */
			if (errno == EINTR && (is_stopping(vm) || vmm_stop_signal))
				return;
			if (errno == EINTR || errno == EAGAIN)
				continue;
			vm_fail(vm, EXIT_KVM_RUN, "vm %d vCPU %d: KVM_RUN: %s, PC 0x%llx", vm->index,
				vcpu->index, strerror(errno), (unsigned long long)vcpu_pc(vcpu));
			return;
		}
		switch (vcpu->run->exit_reason) {
		case KVM_EXIT_MMIO:
			if (!handle_mmio(vcpu))
				return;
			break;
		case KVM_EXIT_SYSTEM_EVENT:
			handle_system_event(vcpu);
			return;
		case KVM_EXIT_INTR:
			if (is_stopping(vm) || vmm_stop_signal)
				return;
			break;
		default:
			vm_fail(vm, EXIT_UNEXPECTED, "vm %d vCPU %d: unexpected exit reason %u, PC "
				"0x%llx", vm->index, vcpu->index, vcpu->run->exit_reason,
				(unsigned long long)vcpu_pc(vcpu));
			return;
		}
	}
}

/* Thread body: pin, mark the first entry, run, report completion. */
static void *vcpu_thread(void *arg)
{
	struct vcpu *vcpu = arg;
	struct vm *vm = vcpu->vm;
	int err = vcpu->cpu >= 0 ? pin_to_cpu(vcpu->cpu) : 0;

	if (err)
		vm_fail(vm, EXIT_USAGE, "cannot pin vCPU %d to CPU %d: %s (is it online and "
			"allowed?)", vcpu->index, vcpu->cpu, strerror(err));
	else {
		trace_marker(vm->opts->trace_fd, "tracekit-vmm: vm=%d event=enter vcpu=%d cpu=%d",
			     vm->index, vcpu->index, vcpu->cpu);
		gt_sync_mark(&vcpu->sync);
		vcpu_loop(vcpu);
	}
	pthread_mutex_lock(&vm->lock);
	vcpu->finished = true;
	vm->finished++;
	pthread_cond_broadcast(&vm->changed);
	pthread_mutex_unlock(&vm->lock);
	return NULL;
}

/* Kick every vCPU thread still running out of KVM_RUN (immediate_exit + a signal). */
static void kick_all(struct vm *vm)
{
	for (int i = 0; i < vm->nvcpus; i++) {
		struct vcpu *vcpu = &vm->vcpus[i];

		if (!vcpu->started || vcpu->finished)
			continue;
		/* immediate_exit covers a thread that is about to enter KVM_RUN. */
		__atomic_store_n(&vcpu->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
		pthread_kill(vcpu->thread, SIGUSR1);
	}
}

/* How often the main thread looks for a stop request while the vCPUs run. */
#define STOP_POLL_NS 50000000L

/* CLOCK_MONOTONIC now plus NS nanoseconds, as a condition-variable deadline. */
static struct timespec monotonic_in(long ns)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	t.tv_nsec += ns;
	t.tv_sec += t.tv_nsec / 1000000000L;
	t.tv_nsec %= 1000000000L;
	return t;
}

/* Whether CLOCK_MONOTONIC has passed DEADLINE. */
static bool monotonic_passed(const struct timespec *deadline)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > deadline->tv_sec ||
	       (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

/* Wait for all vCPU threads; the watchdog (if any) or a stop request (SIGTERM) ends them. */
static void wait_for_run(struct vm *vm)
{
	struct timespec deadline = monotonic_in(0);
	bool timed_out = false;

	deadline.tv_sec += vm->opts->timeout_s;
	pthread_mutex_lock(&vm->lock);
	while (vm->finished < vm->nvcpus && !vm->stopping && !timed_out && !vmm_stop_signal) {
		/* A signal handler cannot signal a condition variable: wait in slices. */
		struct timespec slice = monotonic_in(STOP_POLL_NS);

		pthread_cond_timedwait(&vm->changed, &vm->lock, &slice);
		timed_out = vm->opts->timeout_s && monotonic_passed(&deadline);
	}
	if (vmm_stop_signal && !vm->powered_off) {
		vm->result.stopped = true;
		trace_marker(vm->opts->trace_fd, "tracekit-vmm: vm=%d event=stop signal=%d",
			     vm->index, (int)vmm_stop_signal);
	}
	/* Kick until every thread has returned: a kick can land between two KVM_RUNs. */
	while (vm->finished < vm->nvcpus) {
		struct timespec retry = monotonic_in(10000000L);

		__atomic_store_n(&vm->stopping, true, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&vm->changed);
		kick_all(vm);
		pthread_cond_timedwait(&vm->changed, &vm->lock, &retry);
	}
	pthread_mutex_unlock(&vm->lock);
	for (int i = 0; i < vm->nvcpus; i++)
		if (vm->vcpus[i].started)
			pthread_join(vm->vcpus[i].thread, NULL);
	if (timed_out && !vm->powered_off)
		vm_fail(vm, EXIT_TIMEOUT, "vm %d: timeout: the guest did not power off within %llu "
			"s (vCPU 0 PC 0x%llx); raise --timeout or check the guest", vm->index,
			(unsigned long long)vm->opts->timeout_s,
			(unsigned long long)vcpu_pc(&vm->vcpus[0]));
}

/* Start one thread per vCPU and wait for the run to end. */
static void vm_execute(struct vm *vm)
{
	for (int i = 0; i < vm->nvcpus; i++) {
		struct vcpu *vcpu = &vm->vcpus[i];
		int err = pthread_create(&vcpu->thread, NULL, vcpu_thread, vcpu);

		if (err) {
			vm_fail(vm, EXIT_SYSTEM, "cannot start vCPU thread %d: %s", i,
				strerror(err));
			pthread_mutex_lock(&vm->lock);
			vm->finished += vm->nvcpus - i;	/* never-started threads count as done */
			pthread_mutex_unlock(&vm->lock);
			break;
		}
		vcpu->started = true;
	}
	wait_for_run(vm);
	if (!vm->result.code && !vm->powered_off && !vm->result.stopped)
		vm_fail(vm, EXIT_UNEXPECTED, "vm %d: every vCPU stopped but vCPU 0 never powered "
			"off (PC 0x%llx)", vm->index, (unsigned long long)vcpu_pc(&vm->vcpus[0]));
}

/* Clean+invalidate the cache lines of LEN bytes at P (an MMU-off guest wrote past them). */
static void clean_lines(volatile void *p, size_t len)
{
	for (size_t off = 0; off < len; off += 16)
		__asm__ volatile("dc civac, %0" : : "r"((volatile char *)p + off) : "memory");
	__asm__ volatile("dsb ish" : : : "memory");
}

/* vCPU 0's result words of a knob guest, for its record=vm line. */
static void read_results(struct vm *vm)
{
	volatile uint64_t *words =
		(volatile uint64_t *)(vm->ram + (RESULT_BASE - RAM_BASE));

	clean_lines(words, RESULT_STRIDE);
	for (int i = 0; i < 6; i++)
		vm->result.results[i] = words[i];
	vm->result.has_results = true;
}

/* Check each vCPU's marker; an MMU-off guest wrote past the caches, so clean+inval first. */
static void check_markers(struct vm *vm)
{
	uint64_t expected = vm->image->marker;

	for (int i = 0; i < vm->nvcpus; i++) {
		volatile uint64_t *slot =
			(volatile uint64_t *)(vm->ram + MARKER_OFFSET + 8ull * i);
		uint64_t found;

		clean_lines(slot, 8);
		found = *slot;
		if (found != expected) {
			vm_fail(vm, EXIT_BAD_MARKER, "vm %d vCPU %d: bad marker at IPA 0x%llx: "
				"expected 0x%016llx, found 0x%016llx", vm->index, i,
				RAM_BASE + MARKER_OFFSET + 8ull * i, (unsigned long long)expected,
				(unsigned long long)found);
			return;
		}
	}
	if (vm->opts->knobbed)
		read_results(vm);
}

/* Tear down in full, always: vCPU run pages and fds, the VM fd, then the RAM. */
static void vm_teardown(struct vm *vm)
{
	for (int i = 0; i < vm->nvcpus; i++) {
		struct vcpu *vcpu = &vm->vcpus[i];

		if (vcpu->run)
			munmap(vcpu->run, vm->host->run_size);
		if (vcpu->fd >= 0)
			close(vcpu->fd);
	}
	/* The last reference to the VM goes here: KVM frees its stage 2 now. */
	if (vm->fd >= 0)
		close(vm->fd);
	if (vm->map)
		munmap(vm->map, vm->map_bytes);
}

/* One VM: create, run, check markers, always tear down; time each phase. */
struct vm_result vm_run_one(const struct kvm_host *host, const struct vmm_options *opts,
			    const struct guest_image *image, int index, int ipa_bits,
			    struct vm_timing *timing)
{
	struct vm *vm = calloc(1, sizeof(*vm));
	struct vm_result result;
	pthread_condattr_t cond_attr;
	uint64_t t0, t1, t2;

	if (!vm)
		die(EXIT_SYSTEM, "out of memory");
	*vm = (struct vm){ .host = host, .opts = opts, .image = image, .index = index, .fd = -1 };
	for (int i = 0; i < MAX_VCPUS; i++)
		vm->vcpus[i].fd = -1;
	pthread_mutex_init(&vm->lock, NULL);
	pthread_condattr_init(&cond_attr);
	/* The watchdog's deadlines are CLOCK_MONOTONIC: immune to wall-clock changes. */
	pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
	pthread_cond_init(&vm->changed, &cond_attr);
	pthread_condattr_destroy(&cond_attr);

	trace_marker(opts->trace_fd, "tracekit-vmm: vm=%d event=create ipa_bits=%d vcpus=%d",
		     index, ipa_bits ? ipa_bits : 40, opts->vcpus);
	gt_sync_mark(&timing->create_sync);
	t0 = now_ns(opts->clock);
	if (vm_create(vm, ipa_bits)) {
		t1 = now_ns(opts->clock);
		if (vmm_stop_signal)
			vm->result.stopped = true;	/* asked to stop while creating: never run */
		else
			vm_execute(vm);
		if (!vm->result.code && !vm->result.stopped)
			check_markers(vm);
	} else {
		t1 = now_ns(opts->clock);
		/* The stop signal can interrupt a creation ioctl (KVM_CREATE_VM returns EINTR on
		 * 6.1): that VM was asked to stop, it did not fail. */
		if (vmm_stop_signal && vm->fail_errno == EINTR) {
			vm->result.code = 0;
			vm->result.message[0] = '\0';
			vm->result.stopped = true;
		}
	}
	t2 = vm->powered_off ? vm->poweroff_at : now_ns(opts->clock);
	trace_marker(opts->trace_fd, "tracekit-vmm: vm=%d event=teardown-start", index);
	gt_sync_mark(&timing->teardown_sync);
	timing->run_sync = vm->vcpus[0].sync;
	timing->create_start = t0;
	timing->create_ns = t1 - t0;
	timing->run_ns = t2 > t1 ? t2 - t1 : 0;
	t0 = now_ns(opts->clock);
	vm_teardown(vm);
	timing->teardown_end = now_ns(opts->clock);
	timing->teardown_ns = timing->teardown_end - t0;
	trace_marker(opts->trace_fd, "tracekit-vmm: vm=%d event=teardown-end", index);

	result = vm->result;
	pthread_cond_destroy(&vm->changed);
	pthread_mutex_destroy(&vm->lock);
	free(vm);
	return result;
}
