/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A simulated mechanism inside the ground-truth plugin (docs/simulate.md): per-vCPU
 * state created by a guest action, cleared by invalidations, costing time on each DSB
 * that completes a broadcast TLBI. The model reaches the plugin as its plugin form, a
 * text file `tracekit.simulate` writes from the TOML model (`sim=FILE`).
 *
 * Encodings (Arm ARM, A64 system instructions; SYS is 0xd5080000 | op1<<16 | CRn<<12 |
 * CRm<<8 | op2<<5 | Rt): TLBI ALLE1 is op1=4 CRn=8 CRm=7 op2=4, ALLE1IS CRm=3, ALLE1OS
 * CRm=1; their nXS forms have CRn=9 (bit 12). MSR SCTLR_EL1, Xt is 0xd5181000 | Rt.
 */
#ifndef TKSIM_H
#define TKSIM_H

#include <stdint.h>

#include <qemu-plugin.h>

/* 2: responders' cost (pay, responder_ns, window_ns, cap_ns, irq-entry lines; the log's
 * per-vCPU responder keys and pay-at lines). 3: `pay-when wake|irq` (responders pay only
 * when waking from WFI, or at every IRQ entry); the log's wakes and spared keys.
 * 4: `responder-cpus N...` (only those vCPUs pay as responders), in the form and the log.
 * 5: `cpu-entry KALLSYMS TEXT_PA SYMBOL` (the kernel's CPU entry after PSCI CPU_ON, found at
 * TEXT_PA + SYMBOL - _text: it runs with the MMU off, so its vaddr is its PA) and `clear
 * cpu-on`; the log's cpu-entry-at and cpu-on lines and the per-vCPU entries key.
 * 6: `cpu-entry KALLSYMS TEXT_PA STEXT_PA SYMBOL`: a kallsyms without _text (Debian's 6.1)
 * anchors on _stext at STEXT_PA; the log's `cpu-entry-at SYMBOL PA TEXT_PA STEXT_PA ANCHOR`. */
#define TKSIM_FORMAT 6
/* HINT #0x76 (CRm=0b1110, op2=0b110): unallocated, a NOP on every Armv8/v9 core; the
 * parametric guest runs it right after its SCTLR_EL1 write turned the MMU on. */
#define TKSIM_MMU_ON_MARK 0xd5032edfu
#define TKSIM_MSR_SCTLR_EL1 0xd5181000u
/* WFI is HINT #3 (CRm=0, op2=3); WFIT (FEAT_WFxT, not in QEMU 7.2) is not matched. */
#define TKSIM_WFI 0xd503207fu
#define TKSIM_RT_MASK 0xffffffe0u
/* Rt and the nXS bit (CRn 8 or 9) ignored. */
#define TKSIM_TLBI_MASK 0xffffefe0u
#define TKSIM_ALLE1 0xd50c8780u
#define TKSIM_ALLE1IS 0xd50c8380u
#define TKSIM_ALLE1OS 0xd50c8180u
#define TKSIM_MAX_VCPUS 256	/* the completion ring packs the vCPU in 8 bits */
#define TKSIM_RING 4096		/* recent broadcast completions responders pay for */
#define TKSIM_MAX_IRQ_SYMS 4
#define TKSIM_RESOLVE_TRIES 8	/* markers at which the kallsyms file is looked for */

/* What an instruction does to the simulated state (a site's sim role). */
enum tksim_role {
	TKSIM_NONE = 0,
	TKSIM_CREATE = 1,	/* the model's trigger: the executing vCPU gains a dose */
	TKSIM_CLEAR_LOCAL = 2,	/* TLBI ALLE1: clears the executing vCPU, if the model says so */
	TKSIM_CLEAR_ALL = 3,	/* TLBI ALLE1IS/OS: clears every vCPU, if the model says so */
	TKSIM_BROADCAST = 4,	/* any other TLBI ...IS/OS: a DSB after it pays the cost */
	TKSIM_DSB = 5,		/* DSB ISH/OSH/SY: completes this vCPU's broadcast TLBIs */
	TKSIM_IRQ = 6,		/* the host kernel's IRQ entry: a responder pays what it owes */
	TKSIM_RESOLVE = 7,	/* a clock marker: time to read the IRQ entry's address */
	TKSIM_SLEEP = 8,	/* WFI: the vCPU goes idle; its next IRQ entry is a wake-up */
	TKSIM_CPU_ON = 9,	/* the kernel's CPU entry: the vCPU was powered on (CPU_ON) */
};

/* 1 if the plugin form at `path` was read (and the simulation is on); -1 on error.
 * every_vcpu: list every vCPU below `vcpus` in the log (system mode), else those seen. */
int tksim_load(const char *path, const char *log_path, unsigned int vcpus, int every_vcpu);
/* The role of an instruction word at `vaddr` whose ground-truth kind/flags are given
 * (kind 0: not a logged instruction). */
uint8_t tksim_role(uint32_t word, uint64_t vaddr, uint8_t kind, uint8_t flags);
/* Called as an instruction with a non-zero role starts on `vcpu`. */
void tksim_exec(unsigned int vcpu, uint8_t role, uint64_t vaddr);
/* Write the per-vCPU totals to the simulation log and close it. */
void tksim_finish(void);
int tksim_enabled(void);
/* The plugin's id and how to register its callbacks again after qemu_plugin_reset (which
 * flushes every translated block, so the IRQ entry, once known, gets its callback). */
void tksim_set_plugin(qemu_plugin_id_t id, void (*rearm)(qemu_plugin_id_t id));

#endif
