// SPDX-License-Identifier: GPL-2.0-only
/*
 * tksim: the simulated mechanism of the ground-truth plugin (tksim.h, docs/simulate.md).
 *
 * State: a dose per vCPU (0: holds nothing). The model's trigger adds one (capped at
 * dose_max); its clears set doses to 0. Cost (pay issuer or all): a vCPU that executed
 * a broadcast TLBI (...IS/OS) is delayed, at the first DSB ISH/OSH/SY after it, by
 * fixed_ns + per_dose_ns x dose, where dose is its own (scope holder: only holders pay) or the
 * sum over every vCPU (scope every). The delay is a busy wait in the exec callback, so
 * the vCPU's thread, and the guest clock (QEMU's virtual clock follows the host's
 * without icount), see the time pass.
 *
 * Responders (pay responders or all): while the state holds, each broadcast completion
 * is also put in a ring (time, issuing vCPU). Every other vCPU pays for it at its next
 * entry into the host kernel's IRQ handler (el1h/el0t_64_irq_handler, on every
 * wake-up path), responder_ns per completion it has not paid for yet, counting only
 * those of the last window_ns (a CPU that slept long owes only the recent ones) and at
 * most cap_ns per entry. The handler's address is read from the boot's kallsyms file
 * (KASLR: known only once the kernel runs) at the first clock marker, after which
 * qemu_plugin_reset flushes the translated blocks so the handler gets its callback.
 * Real DVM handling stalls a responder when the message arrives, not at its next IRQ:
 * this is where the plugin can charge it cheaply and on the path a wake-up takes.
 * With `pay-when wake` only a wake-up pays: a vCPU that executed WFI since its last IRQ
 * entry pays, at that entry, for the completions that came while it slept (since its
 * first WFI, within window_ns); an entry without a WFI before it (a busy CPU's tick or
 * IPI) pays nothing, and the completions it would have owed are counted as spared.
 * With `responder-cpus N...` only those vCPUs pay (e.g. the isolated rt CPU); the others
 * enter their IRQ handler at no cost and count no wakes.
 *
 * Power cycle (`cpu-entry` line): the kernel's entry after PSCI CPU_ON (secondary_entry,
 * arch/arm64/kernel/psci.c cpu_psci_cpu_boot passes its __pa_symbol) runs with the MMU off,
 * so the plugin sees it at its physical address: TEXT_PA (where QEMU loaded the Image,
 * computed by tracekit from the Image header) + SYMBOL - _text (from the same kallsyms
 * file, read at the same clock marker). A kallsyms without _text (6.1 without
 * CONFIG_KALLSYMS_ALL starts at _stext) anchors on _stext instead, at STEXT_PA (TEXT_PA +
 * the head's size, BaseOfCode in the Image's PE header, also from tracekit). Each execution there is one power-on of that
 * vCPU, logged as `cpu-on`; with `clear cpu-on` it clears that vCPU's state. Secondaries
 * brought up at boot enter before the marker and are not seen.
 *
 * Where the delay lands: in multi-threaded TCG a broadcast TLBI's flush runs as
 * "safe work" in an exclusive section, which waits for every other vCPU to leave its
 * execution loop, so a vCPU busy in a delay holds up every other vCPU's broadcast.
 * For each vCPU the log says, beside what was injected and what the wait really took,
 * how long its own TLBI -> DSB spans were and how much of them overlapped another
 * vCPU's delay (the time it plausibly waited for that delay).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tkgt.h"
#include "tksim.h"

struct vcpu_sim {
	uint64_t dose;		/* atomic: 0 holds nothing */
	uint64_t tlbi_ts;	/* first broadcast TLBI since the last DSB (0: none) */
	uint64_t delay_start;	/* atomic: the current or last delay */
	uint64_t delay_end;	/* atomic: 0 while a delay runs */
	uint64_t creates, clears, delayed, injected_ns, actual_ns;
	uint64_t spans, span_ns, waited_spans, waited_ns;
	/* As a responder: completions put in the ring, IRQ entries that paid, completions
	 * they paid for, what those asked (responder_ns each), what was injected (capped)
	 * and what the wait really took. */
	uint64_t bcasts, pays, owed, asked_ns, paid_ns, paid_actual_ns;
	/* pay-when wake: IRQ entries after a WFI, and the completions of the window since the
	 * last entry that were not charged (they came while it was awake). */
	uint64_t wakes, spared;
	uint64_t entries;	/* executions of the kernel's CPU entry: power-ons (CPU_ON) */
	uint64_t last_paid;	/* the last IRQ entry's time: nothing before it is owed */
	uint64_t slept_at;	/* its first WFI since the last IRQ entry (0: none) */
	int seen;		/* any simulated instruction ran on it */
};

static struct {
	int on;
	int create_sctlr, create_mark;
	uint64_t lo, hi;		/* vaddr window of the SCTLR trigger */
	int clear_local, clear_all, clear_cpu_on;
	int cpu_entry;		/* a cpu-entry line: find the kernel's CPU entry */
	uint64_t text_pa;	/* where _text is in physical memory (the Image's load address) */
	uint64_t stext_pa;	/* where _stext is: the anchor when kallsyms has no _text */
	int entry_resolved;	/* atomic: entry_pa is known (kallsyms had an anchor and SYMBOL) */
	char entry_sym[64];
	uint64_t text_va, stext_va, entry_va, entry_pa;	/* published by irq_state (release) */
	int scope_every;
	int pay_issuer, pay_responders;
	int pay_on_wake;	/* responders pay only at an IRQ entry after a WFI */
	int some_respond;	/* a responder-cpus line: only the vCPUs it names pay */
	uint8_t responds[TKSIM_MAX_VCPUS];
	uint64_t fixed_ns, per_dose_ns, dose_max;
	uint64_t responder_ns, window_ns, cap_ns;
	char kallsyms[1024];
	char irq_syms[TKSIM_MAX_IRQ_SYMS][64];
	unsigned int n_irq_syms;
	uint64_t irq_addr[TKSIM_MAX_IRQ_SYMS];
	int irq_state;		/* atomic, enum irq_state */
	unsigned int tries;
	qemu_plugin_id_t id;
	void (*rearm)(qemu_plugin_id_t id);
	char name[64], hash[80];
	unsigned int vcpus;
	int every_vcpu;		/* system mode: the log lists every vCPU */
	FILE *log;
} sim;

enum irq_state { IRQ_UNUSED, IRQ_PENDING, IRQ_RESOLVED, IRQ_FAILED };

static struct vcpu_sim cpus[TKSIM_MAX_VCPUS];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast completions while the state holds: (time << 8) | vCPU, one atomic word each. */
static uint64_t ring[TKSIM_RING];
static uint64_t ring_head;	/* atomic: completions ever put in */

void tksim_set_plugin(qemu_plugin_id_t id, void (*rearm)(qemu_plugin_id_t id))
{
	sim.id = id;
	sim.rearm = rearm;
}

int tksim_enabled(void)
{
	return sim.on;
}

static uint64_t now_ns(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* A kallsyms path for the irq-entry or cpu-entry line: 1 if it is the first, or the same. */
static int same_kallsyms(const char *path)
{
	if (sim.kallsyms[0] && strcmp(sim.kallsyms, path) != 0)
		return 0;
	strcpy(sim.kallsyms, path);
	return 1;
}

/* `cpu-entry KALLSYMS TEXT_PA STEXT_PA SYMBOL`: where a powered-on CPU enters; 0 if
 * understood. */
static int parse_cpu_entry(const char *rest)
{
	char path[sizeof(sim.kallsyms)];
	int used = 0;

	if (sscanf(rest, "%1023s %" SCNx64 " %" SCNx64 " %63s%n", path, &sim.text_pa,
		   &sim.stext_pa, sim.entry_sym, &used) != 4 || sim.stext_pa <= sim.text_pa ||
	    rest[used + strspn(rest + used, " ")] != 0 || !same_kallsyms(path))
		return -1;
	sim.cpu_entry = 1;
	sim.irq_state = IRQ_PENDING;
	return 0;
}

/* `irq-entry KALLSYMS SYMBOL...`: where responders pay; 0 if understood. */
static int parse_irq_entry(const char *rest)
{
	char path[sizeof(sim.kallsyms)];
	int used = 0;

	if (sscanf(rest, "%1023s%n", path, &used) != 1 || !same_kallsyms(path))
		return -1;
	rest += used;
	while (sim.n_irq_syms < TKSIM_MAX_IRQ_SYMS &&
	       sscanf(rest, " %63s%n", sim.irq_syms[sim.n_irq_syms], &used) == 1) {
		sim.n_irq_syms++;
		rest += used;
	}
	sim.irq_state = IRQ_PENDING;
	return sim.n_irq_syms ? 0 : -1;
}

/* `responder-cpus N...`: the only vCPUs that pay as responders; 0 if understood. */
static int parse_responder_cpus(const char *rest)
{
	unsigned int cpu;
	int used = 0, any = 0;

	while (sscanf(rest, " %u%n", &cpu, &used) == 1) {
		if (cpu >= TKSIM_MAX_VCPUS)
			return -1;
		sim.responds[cpu] = 1;
		any = 1;
		rest += used;
	}
	sim.some_respond = 1;
	return any && rest[strspn(rest, " ")] == 0 ? 0 : -1;
}

/* One line of the plugin form; 0 if understood. */
static int parse_line(const char *line)
{
	char word[32];

	if (sscanf(line, "model %63s %79s", sim.name, sim.hash) == 2)
		return 0;
	if (sscanf(line, "create sctlr %" SCNx64 " %" SCNx64, &sim.lo, &sim.hi) == 2) {
		sim.create_sctlr = 1;
		return 0;
	}
	if (strcmp(line, "create mark") == 0) {
		sim.create_mark = 1;
		return 0;
	}
	if (strcmp(line, "create none") == 0 || strcmp(line, "clear nothing") == 0)
		return 0;
	if (strcmp(line, "clear alle1-local") == 0) {
		sim.clear_local = 1;
		return 0;
	}
	if (strcmp(line, "clear alle1is") == 0) {
		sim.clear_all = 1;
		return 0;
	}
	if (strcmp(line, "clear cpu-on") == 0) {
		sim.clear_cpu_on = 1;
		return 0;
	}
	if (strncmp(line, "cpu-entry ", 10) == 0)
		return parse_cpu_entry(line + 10);
	if (sscanf(line, "scope %31s", word) == 1 &&
	    (strcmp(word, "every") == 0 || strcmp(word, "holder") == 0)) {
		sim.scope_every = strcmp(word, "every") == 0;
		return 0;
	}
	if (sscanf(line, "pay %31s", word) == 1 && (strcmp(word, "issuer") == 0 ||
						     strcmp(word, "responders") == 0 ||
						     strcmp(word, "all") == 0)) {
		sim.pay_issuer = strcmp(word, "responders") != 0;
		sim.pay_responders = strcmp(word, "issuer") != 0;
		return 0;
	}
	if (sscanf(line, "pay-when %31s", word) == 1 &&
	    (strcmp(word, "wake") == 0 || strcmp(word, "irq") == 0)) {
		sim.pay_on_wake = strcmp(word, "wake") == 0;
		return 0;
	}
	if (strncmp(line, "irq-entry ", 10) == 0)
		return parse_irq_entry(line + 10);
	if (strncmp(line, "responder-cpus ", 15) == 0)
		return parse_responder_cpus(line + 15);
	if (sscanf(line, "responder_ns %" SCNu64, &sim.responder_ns) == 1 ||
	    sscanf(line, "window_ns %" SCNu64, &sim.window_ns) == 1 ||
	    sscanf(line, "cap_ns %" SCNu64, &sim.cap_ns) == 1)
		return 0;
	if (sscanf(line, "fixed_ns %" SCNu64, &sim.fixed_ns) == 1 ||
	    sscanf(line, "per_dose_ns %" SCNu64, &sim.per_dose_ns) == 1 ||
	    sscanf(line, "dose_max %" SCNu64, &sim.dose_max) == 1)
		return 0;
	return -1;
}

/* The log's `responder-cpus N...` line: who pays as a responder (none: every vCPU). */
static void log_responder_cpus(void)
{
	unsigned int v;

	if (!sim.pay_responders || !sim.some_respond)
		return;
	fputs("responder-cpus", sim.log);
	for (v = 0; v < TKSIM_MAX_VCPUS; v++)
		if (sim.responds[v])
			fprintf(sim.log, " %u", v);
	fputc('\n', sim.log);
}

int tksim_load(const char *path, const char *log_path, unsigned int vcpus, int every_vcpu)
{
	char line[256];
	int format = 0;
	FILE *in = fopen(path, "r");

	if (!in) {
		fprintf(stderr, "tkgt: cannot read the model %s: %s\n", path, strerror(errno));
		return -1;
	}
	sim.dose_max = 1;
	sim.pay_issuer = 1;
	if (!fgets(line, sizeof(line), in) || sscanf(line, "tksim %d", &format) != 1 ||
	    format != TKSIM_FORMAT) {
		fprintf(stderr, "tkgt: %s is not a plugin form of format %d\n", path, TKSIM_FORMAT);
		fclose(in);
		return -1;
	}
	while (fgets(line, sizeof(line), in)) {
		line[strcspn(line, "\n")] = 0;
		if (line[0] && line[0] != '#' && parse_line(line)) {
			fprintf(stderr, "tkgt: %s: cannot read the line '%s'\n", path, line);
			fclose(in);
			return -1;
		}
	}
	fclose(in);
	if (sim.pay_responders && !sim.n_irq_syms) {
		fprintf(stderr, "tkgt: %s: responders pay, but no irq-entry line says where\n", path);
		return -1;
	}
	if (sim.clear_cpu_on && !sim.cpu_entry) {
		fprintf(stderr, "tkgt: %s: cpu-on clears, but no cpu-entry line says where\n", path);
		return -1;
	}
	if (vcpus > TKSIM_MAX_VCPUS) {
		fprintf(stderr, "tkgt: simulation supports at most %d vCPUs\n", TKSIM_MAX_VCPUS);
		return -1;
	}
	sim.log = fopen(log_path, "w");
	if (!sim.log) {
		fprintf(stderr, "tkgt: cannot create %s: %s\n", log_path, strerror(errno));
		return -1;
	}
	sim.vcpus = vcpus;
	sim.every_vcpu = every_vcpu;
	sim.on = 1;
	fprintf(sim.log, "tksim-log %d\nmodel %s %s\nclock %d\n", TKSIM_FORMAT, sim.name,
		sim.hash, CLOCK_MONOTONIC);
	log_responder_cpus();
	fflush(sim.log);
	return 1;
}

uint8_t tksim_role(uint32_t word, uint64_t vaddr, uint8_t kind, uint8_t flags)
{
	if (!sim.on)
		return TKSIM_NONE;
	if (__atomic_load_n(&sim.irq_state, __ATOMIC_ACQUIRE) == IRQ_RESOLVED) {
		unsigned int i;

		for (i = 0; i < sim.n_irq_syms; i++)
			if (vaddr == sim.irq_addr[i])
				return TKSIM_IRQ;
		/* A physical address: code running with the MMU off runs there (the guests'
		 * code at 0x40000000-0x400fffff lies below TEXT_PA; the kernel's and the
		 * hypervisor's virtual addresses are elsewhere). Not guarded: a user mapping
		 * placed at that very address (MAP_FIXED) would count as a power-on. */
		if (sim.cpu_entry && __atomic_load_n(&sim.entry_resolved, __ATOMIC_ACQUIRE) &&
		    vaddr == sim.entry_pa)
			return TKSIM_CPU_ON;
	}
	if (kind == TKGT_MARK && __atomic_load_n(&sim.irq_state, __ATOMIC_ACQUIRE) == IRQ_PENDING)
		return TKSIM_RESOLVE;
	if (sim.pay_responders && sim.pay_on_wake && word == TKSIM_WFI)
		return TKSIM_SLEEP;
	if (sim.create_mark && word == TKSIM_MMU_ON_MARK)
		return TKSIM_CREATE;
	if (sim.create_sctlr && (word & TKSIM_RT_MASK) == TKSIM_MSR_SCTLR_EL1 && vaddr >= sim.lo &&
	    vaddr < sim.hi)
		return TKSIM_CREATE;
	if (kind == TKGT_TLBI || kind == TKGT_TLBI_NXS) {
		uint32_t op = word & TKSIM_TLBI_MASK;

		if (op == TKSIM_ALLE1)
			return TKSIM_CLEAR_LOCAL;
		if (op == TKSIM_ALLE1IS || op == TKSIM_ALLE1OS)
			return TKSIM_CLEAR_ALL;
		/* ALLE1IS/OS also complete as broadcasts, but they clear first: the DSB
		 * after them pays only if something still holds the state. */
		return (flags & 3) == TKGT_INNER || (flags & 3) == TKGT_OUTER ? TKSIM_BROADCAST :
										   TKSIM_NONE;
	}
	if ((kind == TKGT_DSB || kind == TKGT_DSB_NXS) && (flags & 3) != TKGT_NONSHARED)
		return TKSIM_DSB;
	return TKSIM_NONE;
}

static void log_event(const char *what, uint64_t ts, unsigned int vcpu, uint64_t value,
		      uint64_t vaddr)
{
	pthread_mutex_lock(&log_lock);
	fprintf(sim.log, "%s %" PRIu64 " %u %" PRIu64 " 0x%" PRIx64 "\n", what, ts, vcpu, value,
		vaddr);
	fflush(sim.log);
	pthread_mutex_unlock(&log_lock);
}

/* Clear one vCPU; 1 if it held the state. */
static int clear_one(unsigned int v)
{
	return __atomic_exchange_n(&cpus[v].dose, 0, __ATOMIC_RELAXED) != 0;
}

static uint64_t dose_of(unsigned int vcpu)
{
	uint64_t total = 0;
	unsigned int v;

	if (!sim.scope_every)
		return __atomic_load_n(&cpus[vcpu].dose, __ATOMIC_RELAXED);
	for (v = 0; v < sim.vcpus; v++)
		total += __atomic_load_n(&cpus[v].dose, __ATOMIC_RELAXED);
	return total;
}

/* How much of [start, end] another vCPU spent in a delay (its current or last one). */
static uint64_t overlap_with_delays(unsigned int vcpu, uint64_t start, uint64_t end)
{
	uint64_t waited = 0;
	unsigned int v;

	for (v = 0; v < sim.vcpus; v++) {
		uint64_t s = __atomic_load_n(&cpus[v].delay_start, __ATOMIC_ACQUIRE);
		uint64_t e = __atomic_load_n(&cpus[v].delay_end, __ATOMIC_ACQUIRE);

		if (v == vcpu || s == 0)
			continue;
		e = e ? e : end;
		s = s > start ? s : start;
		e = e < end ? e : end;
		if (e > s && e - s > waited)
			waited = e - s;
	}
	return waited;
}

/* Busy-wait `ns` on this vCPU's thread; how long it really took. */
static uint64_t busy_wait(struct vcpu_sim *c, uint64_t ns)
{
	uint64_t start = now_ns(), end;

	__atomic_store_n(&c->delay_end, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&c->delay_start, start, __ATOMIC_RELEASE);
	/* A busy wait: nanosleep's wake-up slack on a loaded machine is larger than the
	 * delays models ask for. */
	do
		end = now_ns();
	while (end - start < ns);
	__atomic_store_n(&c->delay_end, end, __ATOMIC_RELEASE);
	return end - start;
}

static void delay(struct vcpu_sim *c, uint64_t ns)
{
	c->delayed++;
	c->injected_ns += ns;
	c->actual_ns += busy_wait(c, ns);
}

/* A completion responders will pay for: into the ring, newest last. */
static void put_completion(unsigned int vcpu, uint64_t ts)
{
	uint64_t slot = __atomic_fetch_add(&ring_head, 1, __ATOMIC_ACQ_REL);

	__atomic_store_n(&ring[slot % TKSIM_RING], ts << 8 | vcpu, __ATOMIC_RELEASE);
}

/* Other vCPUs' completions after `since` (newest first, at most the ring's size). */
static uint64_t completions_since(unsigned int vcpu, uint64_t since)
{
	uint64_t head = __atomic_load_n(&ring_head, __ATOMIC_ACQUIRE), count = 0, i;

	for (i = head; i > 0 && head - i < TKSIM_RING; i--) {
		uint64_t entry = __atomic_load_n(&ring[(i - 1) % TKSIM_RING], __ATOMIC_ACQUIRE);

		if (entry >> 8 <= since)
			break;
		count += (entry & 0xff) != vcpu;
	}
	return count;
}

static uint64_t later(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* An IRQ entry on `vcpu`: pay for the recent completions it has not paid for (with
 * pay-when wake: only on a wake-up, for those that came while it slept). */
static void pay_as_responder(unsigned int vcpu, struct vcpu_sim *c)
{
	uint64_t now = now_ns(), window, since, owed, asked, paid;

	window = later(now > sim.window_ns ? now - sim.window_ns : 0, c->last_paid);
	since = window;
	if (sim.pay_on_wake) {
		uint64_t in_window;

		/* Awake since its last entry (no WFI): it owes nothing. */
		c->wakes += c->slept_at != 0;
		since = c->slept_at ? later(window, c->slept_at) : now;
		c->slept_at = 0;
		owed = completions_since(vcpu, since);
		/* Scanned after: a completion put in meanwhile is counted here, not lost. */
		in_window = completions_since(vcpu, window);
		c->spared += in_window > owed ? in_window - owed : 0;
	} else {
		owed = completions_since(vcpu, since);
	}
	c->last_paid = now;
	if (!owed)
		return;
	asked = owed * sim.responder_ns;
	paid = asked < sim.cap_ns ? asked : sim.cap_ns;
	c->pays++;
	c->owed += owed;
	c->asked_ns += asked;
	c->paid_ns += paid;
	c->paid_actual_ns += busy_wait(c, paid);
}

/* A DSB on `vcpu`: completes its broadcast TLBIs, paying the model's cost. */
static void complete_broadcast(unsigned int vcpu, struct vcpu_sim *c)
{
	uint64_t ts = now_ns(), dose, waited;

	if (!c->tlbi_ts)
		return;
	c->spans++;
	c->span_ns += ts - c->tlbi_ts;
	waited = overlap_with_delays(vcpu, c->tlbi_ts, ts);
	if (waited) {
		c->waited_spans++;
		c->waited_ns += waited;
	}
	c->tlbi_ts = 0;
	dose = dose_of(vcpu);
	if (!dose)
		return;
	if (sim.pay_responders) {
		c->bcasts++;
		put_completion(vcpu, ts);
	}
	if (sim.pay_issuer)
		delay(c, sim.fixed_ns + sim.per_dose_ns * dose);
}

/* Whether the CPU entry's symbols are found (or not asked for). The anchor is _text when
 * kallsyms has it, else _stext; both give the same PA when the Image's BaseOfCode is
 * right (and kallsyms is in address order, so either is met before secondary_entry). */
static int entry_found(void)
{
	uint64_t anchor = sim.text_va ? sim.text_va : sim.stext_va;

	return !sim.cpu_entry || (anchor && sim.entry_va >= anchor);
}

/* One `ADDR TYPE NAME` line: note it if it is a symbol the plugin looks for. */
static void note_symbol(uint64_t addr, const char *name, unsigned int *found)
{
	unsigned int i;

	for (i = 0; i < sim.n_irq_syms; i++)
		if (!sim.irq_addr[i] && strcmp(name, sim.irq_syms[i]) == 0) {
			sim.irq_addr[i] = addr;
			(*found)++;
		}
	if (sim.cpu_entry && !sim.text_va && strcmp(name, "_text") == 0)
		sim.text_va = addr;
	if (sim.cpu_entry && !sim.stext_va && strcmp(name, "_stext") == 0)
		sim.stext_va = addr;
	if (sim.cpu_entry && !sim.entry_va && strcmp(name, sim.entry_sym) == 0)
		sim.entry_va = addr;
}

/* The kallsyms file: the IRQ entries' and the CPU entry's addresses; 0 if the IRQ
 * entries are all found. The two are independent: a kallsyms without either anchor
 * leaves the CPU entry unresolved and must not stop the responders' payments. Each try
 * reads the whole file afresh (a retry after a partial find, of a file written late,
 * counts every symbol again, and keeps nothing from the short read). */
static int read_kallsyms(void)
{
	char line[512], name[128], type;
	uint64_t addr;
	unsigned int found = 0;
	FILE *in = fopen(sim.kallsyms, "r");

	if (!in)
		return -1;
	memset(sim.irq_addr, 0, sizeof(sim.irq_addr));
	sim.text_va = sim.stext_va = sim.entry_va = 0;
	while ((found < sim.n_irq_syms || !entry_found()) && fgets(line, sizeof(line), in))
		if (sscanf(line, "%" SCNx64 " %c %127s", &addr, &type, name) == 3)
			note_symbol(addr, name, &found);
	fclose(in);
	if (found < sim.n_irq_syms)
		return -1;
	/* KASLR moves the kernel's virtual addresses, not its physical place (no EFI stub
	 * ran): the entry is as far above the anchor's PA as the symbol is above it. */
	if (sim.cpu_entry && entry_found()) {
		if (sim.text_va)
			sim.entry_pa = sim.text_pa + (sim.entry_va - sim.text_va);
		else
			sim.entry_pa = sim.stext_pa + (sim.entry_va - sim.stext_va);
		__atomic_store_n(&sim.entry_resolved, 1, __ATOMIC_RELEASE);
	}
	return 0;
}

/* `cpu-entry-at SYMBOL PA TEXT_PA STEXT_PA ANCHOR` (SYMBOL `unresolved`: not found). */
static void log_cpu_entry(int resolved)
{
	const char *anchor = !resolved ? "none" : sim.text_va ? "_text" : "_stext";

	fprintf(sim.log, "cpu-entry-at %s 0x%" PRIx64 " 0x%" PRIx64 " 0x%" PRIx64 " %s\n",
		resolved ? sim.entry_sym : "unresolved", resolved ? sim.entry_pa : 0,
		sim.text_pa, sim.stext_pa, anchor);
}

/* The log's resolution lines: where responders pay, where a CPU enters. Nothing is
 * watched until every IRQ entry is found (tksim_role), so after IRQ_FAILED the CPU entry
 * is logged unresolved even if kallsyms placed it: unwatched is what happened (the
 * pay-at lines with 0x0 say why; tracekit.simulate.simlog words it so). */
static void log_resolution(int state)
{
	unsigned int i;

	for (i = 0; i < sim.n_irq_syms; i++)
		fprintf(sim.log, "pay-at %s 0x%" PRIx64 "\n", sim.irq_syms[i], sim.irq_addr[i]);
	if (sim.cpu_entry)
		log_cpu_entry(state == IRQ_RESOLVED && sim.entry_resolved);
}

/* A clock marker: the boot's kallsyms is written by now; find the IRQ entries, then
 * retranslate everything so they get their callback. */
static void resolve_irq_entries(void)
{
	int state = IRQ_FAILED;

	pthread_mutex_lock(&resolve_lock);
	if (__atomic_load_n(&sim.irq_state, __ATOMIC_ACQUIRE) != IRQ_PENDING) {
		pthread_mutex_unlock(&resolve_lock);
		return;
	}
	if (read_kallsyms() == 0)
		state = IRQ_RESOLVED;
	else if (++sim.tries < TKSIM_RESOLVE_TRIES)
		state = IRQ_PENDING;
	pthread_mutex_lock(&log_lock);
	if (state != IRQ_PENDING)
		log_resolution(state);
	fflush(sim.log);
	pthread_mutex_unlock(&log_lock);
	__atomic_store_n(&sim.irq_state, state, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&resolve_lock);
	if (state == IRQ_RESOLVED)
		qemu_plugin_reset(sim.id, sim.rearm);
}

void tksim_exec(unsigned int vcpu, uint8_t role, uint64_t vaddr)
{
	struct vcpu_sim *c;
	uint64_t dose;
	unsigned int v, cleared = 0;

	if (vcpu >= TKSIM_MAX_VCPUS)
		return;
	c = &cpus[vcpu];
	c->seen = 1;
	switch (role) {
	case TKSIM_CREATE:
		dose = __atomic_load_n(&c->dose, __ATOMIC_RELAXED);
		dose = dose < sim.dose_max ? dose + 1 : dose;
		__atomic_store_n(&c->dose, dose, __ATOMIC_RELAXED);
		c->creates++;
		log_event("create", now_ns(), vcpu, dose, vaddr);
		break;
	case TKSIM_CLEAR_LOCAL:
		if (sim.clear_local && clear_one(vcpu)) {
			c->clears++;
			log_event("clear-local", now_ns(), vcpu, 1, vaddr);
		}
		break;
	case TKSIM_CLEAR_ALL:
		if (!c->tlbi_ts)
			c->tlbi_ts = now_ns();
		if (!sim.clear_all)
			break;
		for (v = 0; v < sim.vcpus; v++)
			cleared += (unsigned int)clear_one(v);
		if (cleared) {
			c->clears++;
			log_event("clear-all", now_ns(), vcpu, cleared, vaddr);
		}
		break;
	case TKSIM_BROADCAST:
		if (!c->tlbi_ts)
			c->tlbi_ts = now_ns();
		break;
	case TKSIM_DSB:
		complete_broadcast(vcpu, c);
		break;
	case TKSIM_IRQ:
		if (sim.pay_responders && (!sim.some_respond || sim.responds[vcpu]))
			pay_as_responder(vcpu, c);
		break;
	case TKSIM_RESOLVE:
		resolve_irq_entries();
		break;
	case TKSIM_SLEEP:
		if (!c->slept_at)
			c->slept_at = now_ns();
		break;
	case TKSIM_CPU_ON:
		/* A power-on starts the CPU afresh: nothing of its past is pending. */
		c->entries++;
		c->tlbi_ts = 0;
		c->slept_at = 0;
		cleared = sim.clear_cpu_on && clear_one(vcpu);
		c->clears += cleared;
		log_event("cpu-on", now_ns(), vcpu, cleared, vaddr);
		break;
	}
}

void tksim_finish(void)
{
	unsigned int v;

	if (!sim.on)
		return;
	pthread_mutex_lock(&log_lock);
	for (v = 0; v < sim.vcpus; v++) {
		struct vcpu_sim *c = &cpus[v];

		if (!sim.every_vcpu && !c->seen)
			continue;
		fprintf(sim.log,
			"vcpu %u creates %" PRIu64 " clears %" PRIu64 " delayed %" PRIu64
			" injected_ns %" PRIu64 " actual_ns %" PRIu64 " spans %" PRIu64
			" span_ns %" PRIu64 " waited_spans %" PRIu64 " waited_ns %" PRIu64
			" dose %" PRIu64 " bcasts %" PRIu64 " pays %" PRIu64 " owed %" PRIu64
			" asked_ns %" PRIu64 " paid_ns %" PRIu64 " paid_actual_ns %" PRIu64
			" wakes %" PRIu64 " spared %" PRIu64 " entries %" PRIu64 "\n",
			v, c->creates, c->clears, c->delayed, c->injected_ns, c->actual_ns, c->spans,
			c->span_ns, c->waited_spans, c->waited_ns, c->dose, c->bcasts, c->pays,
			c->owed, c->asked_ns, c->paid_ns, c->paid_actual_ns, c->wakes, c->spared,
			c->entries);
	}
	if (__atomic_load_n(&sim.irq_state, __ATOMIC_ACQUIRE) == IRQ_PENDING) {
		/* No marker ran: nobody paid, no CPU entry was seen. */
		if (sim.n_irq_syms)
			fprintf(sim.log, "pay-at unresolved 0x0\n");
		if (sim.cpu_entry)
			log_cpu_entry(0);
	}
	fprintf(sim.log, "complete 1\n");
	fclose(sim.log);
	sim.log = NULL;
	pthread_mutex_unlock(&log_lock);
}
