"""`tracekit simulate`: the shipped models, and what a model predicts for a campaign plan."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def simulate() -> None:
    """Simulated mechanisms (docs/simulate.md): models injected into the emulated host."""


@simulate.command("models")
def models() -> None:
    """List the shipped models: name@hash, how the trigger is seen, and what each says."""
    from tracekit.simulate.model import load_model, shipped_models

    for name in shipped_models():
        model = load_model(name)
        click.echo(f"{model.label} [{model.trigger_kind}]: {model.summary}")


@simulate.command("predict")
@click.argument("model")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
def predict(model: str, plan: Path) -> None:
    """What each condition of a campaign PLAN should show under MODEL, before running."""
    from tracekit.campaign.plan import load_plan
    from tracekit.simulate.model import load_model
    from tracekit.simulate.predict import OBSERVABLES, predict_plan

    chosen, conditions = load_model(model), load_plan(plan)
    click.echo(f"predictions of {chosen.label} for {plan}, per observable:")
    for observable, meaning in OBSERVABLES.items():
        click.echo(f"  {observable}: {meaning}")
    said = [predict_plan(chosen, conditions, observable) for observable in OBSERVABLES]
    for cell in zip(*said, strict=True):
        c = cell[0].condition
        where = f"{c.variant}, after-guest {c.after_guest}, KVM {c.kvm_mode}, {c.kernel}"
        extra = "" if c.knobs == "none" else f", {c.knobs}"
        click.echo(f"{where}{extra}:")
        for p in cell:
            click.echo(f"  {p.observable}: {p.verdict} ({p.size}); {p.why}")
