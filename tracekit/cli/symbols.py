"""`tracekit symbols`: addresses, hypercall names, struct offsets, probe arguments, guests.

Host-safe: stdlib, click and pyelftools only (never polars).
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.errors import TracekitError

_FILE = click.Path(path_type=Path, dir_okay=False)


def _progress(message: str) -> None:
    """Progress lines go to stderr, so stdout stays the answer."""
    click.echo(message, err=True)


def _hex_int(text: str | None) -> int | None:
    """An optional signed hex KASLR offset."""
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        raise TracekitError(f"bad --kaslr-offset {text!r}: give hex such as 0x3e0a000000") from None


@click.group()
def symbols() -> None:
    """Kernel and guest symbols: resolve, hypcalls, offsetof, probe-args, guest, fetch."""


@symbols.command()
@click.argument("source", type=_FILE)
@click.argument("addresses", nargs=-1, required=True)
@click.option("--kallsyms", type=_FILE, help="kallsyms copy of the same boot (KASLR shift).")
@click.option("--kaslr-offset", help="KASLR shift in hex, when no kallsyms copy is at hand.")
def resolve(
    source: Path, addresses: tuple[str, ...], kallsyms: Path | None, kaslr_offset: str | None
) -> None:
    """Print `ADDRESS NAME+OFF` for each address, from a VMLINUX or a KALLSYMS copy."""
    from tracekit.symbols.kallsyms import is_kallsyms
    from tracekit.symbols.resolve import load_table, parse_address, resolve_all

    numbers = [parse_address(text) for text in addresses]
    table = load_table(source, kallsyms, _hex_int(kaslr_offset))
    if kallsyms is None and kaslr_offset is None and not is_kallsyms(source):
        _progress("symbols: no --kallsyms/--kaslr-offset: taking addresses as link addresses")
    for address, found in zip(numbers, resolve_all(table, numbers), strict=True):
        click.echo(f"{address:016x} {found if found else '?'}")


@symbols.command()
@click.argument("vmlinux", type=_FILE, required=False)
@click.option("--release", help="Use the bundled table of this kernel (e.g. 6.1.0-50-arm64).")
def hypcalls(vmlinux: Path | None, release: str | None) -> None:
    """List host hypercall IDs and names, from VMLINUX's DWARF or a bundled table."""
    from tracekit.symbols import hypcalls as calls
    from tracekit.symbols.vmlinux import open_vmlinux

    if vmlinux is None and release is None:
        raise TracekitError("give a debug VMLINUX or --release RELEASE for the bundled table")
    if vmlinux is not None:
        with open_vmlinux(vmlinux) as opened:
            table = calls.from_vmlinux(opened)
    else:
        table = calls.bundled(release or "")
    click.echo(f"# source: {table.source}")
    for number, name in sorted(table.names.items()):
        click.echo(f"{calls.SMCCC_HOST_BASE | number:#010x} {number:3d} {name}")


@symbols.command()
@click.argument("vmlinux", type=_FILE)
@click.argument("spec")
@click.option("--anchor", multiple=True, help="A function whose source file uses the struct.")
def offsetof(vmlinux: Path, spec: str, anchor: tuple[str, ...]) -> None:
    """Print the byte offset and size of STRUCT.FIELD[.FIELD] from VMLINUX's DWARF."""
    from tracekit.symbols import dwarf
    from tracekit.symbols.offsets import offsetof as find_offset
    from tracekit.symbols.vmlinux import open_vmlinux

    with open_vmlinux(vmlinux) as opened:
        found = find_offset(opened, spec, anchor or dwarf.DEFAULT_ANCHORS)
    size = "?" if found.size is None else str(found.size)
    click.echo(f"{found.path} offset={found.offset} size={size}")


@symbols.command("probe-args")
@click.argument("vmlinux", type=_FILE)
@click.option("-o", "--output", type=_FILE, required=True, help="The probe-args file to write.")
def probe_args(vmlinux: Path, output: Path) -> None:
    """Write kprobe fetch arguments (the VMID) for `tracekit collect --probe-args`."""
    from tracekit.symbols import probeargs
    from tracekit.symbols.vmlinux import open_vmlinux

    with open_vmlinux(vmlinux) as opened:
        args, skipped = probeargs.compute(opened)
        text = probeargs.render(args, opened.build_id, skipped)
    try:
        output.write_text(text)
    except OSError as exc:
        raise TracekitError(f"cannot write {output}: {exc.strerror}") from None
    for name in skipped:
        _progress(f"symbols: skipped {name}: this kernel has no such function")
    _progress(f"symbols: wrote {sum(map(len, args.values()))} fetch arguments to {output}")


@symbols.command()
@click.argument("elf", type=_FILE)
def guest(elf: Path) -> None:
    """Print the variant note, entry and load segments of a reproducer guest ELF."""
    from tracekit.guests import read_variant

    found = read_variant(elf)
    click.echo(f"variant: {found.variant}")
    click.echo(f"description: {found.description}")
    click.echo(f"stage1: {found.stage1}  caches: {found.caches}  asid: {found.asid}")
    click.echo(f"tlbi: {found.tlbi}  setway: {found.setway}  touch: {found.touch}")
    click.echo(f"marker: {found.marker:#x}  registers: {','.join(found.registers)}")
    click.echo(f"entry: {found.entry:#x}")
    for start, size in found.segments:
        click.echo(f"load: {start:#x}-{start + size:#x} ({size} bytes)")


@symbols.command()
@click.option("--kernel", default="bookworm", show_default=True, help="Debian suite.")
@click.option("--release", help="Kernel release (default: the one tracekit vhost boots).")
def fetch(kernel: str, release: str | None) -> None:
    """Download the debug vmlinux (only it) of a Debian arm64 kernel into the cache."""
    from tracekit.symbols.fetch import current_release, fetch_debug_vmlinux

    chosen = release or current_release(kernel, _progress)
    click.echo(fetch_debug_vmlinux(kernel, chosen, _progress))
