"""The plan's report: the IT sheet with the registered array, the ranked table, registration quality
and stability, every parameter, model checksums and software versions."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from stimsim.analysis.power import min_sites_across, trials_text
from stimsim.report import Image, Listing, Paragraph, Report, Section, Table, figure_png, format_value
from stimsim.utilities.figures import pyplot

IT = "IT"
#: Margin around the array in the enlarged panel of the sheet figure: cortex mm plus a fraction of the array's extent.
ZOOM_MARGIN_MM, ZOOM_MARGIN_FRACTION = 0.4, 0.05


def _face_labels(images) -> np.ndarray | None:
    """The label that names faces: ``domain`` where it does (the fLoc images: adult and child faces are the domain
    "face"), else ``category``; None when neither holds faces and other images (the face d′ needs both)."""
    for key in ("domain", "category"):
        labels = images.labels.get(key)
        if labels is not None and bool(np.any(labels == "face")) and not bool(np.all(labels == "face")):
            return labels
    return None


def _face_dprime(model, images) -> np.ndarray | None:
    """Per-unit face d′ of the IT units over the images labelled "face" / other, or None without labels. The
    activity comes from the activation cache (the mapping phase stored it)."""
    from stimsim.behavior.metrics import dprime
    from stimsim.engine.activation_cache import cached_activations

    labels = _face_labels(images)
    if labels is None:
        return None
    activity = cached_activations(model, images.images, IT, batch_size=512).numpy().astype(np.float64)
    is_face = labels == "face"
    values = dprime(activity[is_face], activity[~is_face])
    return np.clip(np.nan_to_num(values, posinf=5.0, neginf=-5.0), -5.0, 5.0)


def map_labels(ids) -> tuple[str, list]:
    """The text prefix every id shares (e.g. ``"elec"`` of Blackrock labels ``elec1`` … ``elec96``; never digits, so
    ``elec1``, ``elec10`` keep their numbers) and the ids without it, short enough to read on the enlarged map."""
    prefix = os.path.commonprefix([str(i) for i in ids]).rstrip("0123456789")
    if any(len(str(i)) == len(prefix) for i in ids):
        prefix = ""
    return prefix, [str(i)[len(prefix):] for i in ids]


#: How the enlarged map writes each kind of electrode's id (see :func:`electrode_kinds`).
ELECTRODE_ID_STYLES = {
    "chosen": {"color": "darkgreen", "fontweight": "bold"},
    "working": {"color": "k"},
    "not rehearsed": {"color": "0.45"},
    "not recorded": {"color": "0.55", "fontstyle": "italic"},
    "broken": {"color": "firebrick"},
}


def electrode_kinds(array_ids, recorded, working, broken, chosen) -> dict:
    """Electrode id → how the map draws it: ``"broken"`` (listed broken, recorded or not), ``"not recorded"`` (in the
    layout, absent from the recordings), ``"chosen"`` (a plan site), ``"working"`` (rehearsed) or ``"not rehearsed"``
    (recorded, but its split-half reliability is under the threshold)."""
    recorded, working, broken, chosen = set(recorded), set(working), set(broken), set(chosen)
    return {e: ("broken" if e in broken else "not recorded" if e not in recorded else "chosen" if e in chosen
                else "working" if e in working else "not rehearsed") for e in map(str, array_ids)}


#: Fill of the electrodes of each Blackrock bank in the pedestal panel.
BANK_COLOURS = {"A": "#cfe2f3", "B": "#fce5cd", "C": "#d9ead3", "D": "#e6d7f0"}


def draw_pedestal(ax, array_layout, kinds: dict, fontsize: float) -> None:
    """The array as the lab sees it on its map and pedestal (the array frame: col from the left, row from the bottom,
    no rotation): every electrode as a cell filled by its Blackrock bank (.cmp maps; grey otherwise), labelled with
    its id styled by its kind (:data:`ELECTRODE_ID_STYLES`), chosen sites ringed in green."""
    from matplotlib.patches import Circle, Patch, Rectangle

    xy = array_layout.positions_mm
    spacing = float(np.min(np.linalg.norm(xy[:, None] - xy[None], axis=-1)[~np.eye(len(xy), dtype=bool)])) \
        if len(xy) > 1 else 0.4
    banks = [bank for bank, _ in array_layout.cerebus] if array_layout.cerebus else ["" for _ in xy]
    ids = list(array_layout.electrode_ids)
    _, labels = map_labels(ids)
    side = 0.9 * spacing
    for electrode, label, bank, (x, y) in zip(ids, labels, banks, xy):
        ax.add_patch(Rectangle((x - side / 2, y - side / 2), side, side, facecolor=BANK_COLOURS.get(bank, "0.93"),
                               edgecolor="0.6", linewidth=0.4))
        if kinds[electrode] == "chosen":
            ax.add_patch(Circle((x, y), 0.42 * spacing, fill=False, edgecolor="limegreen", linewidth=1.6))
        ax.text(x, y, label, fontsize=fontsize, ha="center", va="center", **ELECTRODE_ID_STYLES[kinds[electrode]])
    low, high = xy.min(0) - spacing, xy.max(0) + spacing
    ax.set_xlim(low[0], high[0])
    ax.set_ylim(low[1], high[1])
    ax.set_aspect("equal")
    ax.set_xlabel("array x (mm): col from the left")
    ax.set_ylabel("array y (mm): row from the bottom")
    if array_layout.cerebus:
        present = sorted(set(banks))
        ax.legend([Patch(facecolor=BANK_COLOURS[b], edgecolor="0.6") for b in present],
                  [f"bank {b}" for b in present], fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  ncol=len(present), frameon=False)
    ax.set_title("the array as on its map and pedestal\n"
                 + ("not rotated" if array_layout.cerebus else "not rotated; no banks (not a .cmp map)"), fontsize=9)


def sheet_figure(model, images, mapping, chosen_model, plan, working, array_layout, broken) -> bytes:
    """The chosen model's IT sheet with the registered array (left), the array region enlarged with every
    electrode's id (middle) and the array as the lab sees it (right, :func:`draw_pedestal`): every electrode of
    ``array_layout`` at the fitted pose, recorded ones in black rings, those without recordings in grey dotted rings,
    ``broken`` ones in red, chosen sites in green (see :func:`electrode_kinds` and :data:`ELECTRODE_ID_STYLES`), with
    a legend."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.patheffects import withStroke

    from stimsim.lab.arrays import ArrayPose

    plt = pyplot()
    coords = model.sheet(IT).coordinates_mm
    values = _face_dprime(model, images)
    registration = mapping["registrations"][chosen_model]
    pose = ArrayPose.from_dict(registration["pose"])
    ids = list(array_layout.electrode_ids)
    points = array_layout.on_sheet(pose)
    chosen = set(plan["choice"]["chosen"].tolist())
    kinds = electrode_kinds(ids, registration["electrode_sites_mm"], working, broken, {working[i] for i in chosen})
    low, high = points.min(0), points.max(0)
    centre = (low + high) / 2
    half = (high - low).max() / 2 * (1 + 2 * ZOOM_MARGIN_FRACTION) + ZOOM_MARGIN_MM
    low, high = centre - half, centre + half
    fig, (whole, zoom, pedestal) = plt.subplots(1, 3, figsize=(15.5, 4.2), gridspec_kw={"width_ratios": [1, 1, 1]})
    recorded = set(registration["electrode_sites_mm"])
    # ring colour: broken red, recorded black, without recordings grey; dotted without recordings (broken or not)
    ring_of = [("firebrick" if kinds[e] == "broken" else "k" if e in recorded else "0.6",
                "solid" if e in recorded else "dotted") for e in ids]
    for ax, unit_size, ring_size in ((whole, 5, 12), (zoom, 40, 160)):
        if values is not None:
            colours = ax.scatter(coords[:, 0], coords[:, 1], c=values, cmap="RdBu_r", vmin=-3, vmax=3, s=unit_size,
                                 linewidths=0)
        else:
            ax.scatter(coords[:, 0], coords[:, 1], c="0.8", s=unit_size, linewidths=0)
        for colour, linestyle in sorted(set(ring_of)):
            rows = [k for k, ring in enumerate(ring_of) if ring == (colour, linestyle)]
            ax.scatter(points[rows, 0], points[rows, 1], s=ring_size, facecolors="none", edgecolors=colour,
                       linewidths=1.2 if colour == "firebrick" else 0.6, linestyles=linestyle)
        if chosen:
            picked = plan["cortex_xy"][sorted(chosen)]
            ax.scatter(picked[:, 0], picked[:, 1], s=2.5 * ring_size, facecolors="none", edgecolors="limegreen",
                       linewidths=1.6)
        ax.set_aspect("equal")
        ax.set_xlabel("sheet x (cortex mm)")
    whole.add_patch(Rectangle(low, *(high - low), fill=False, edgecolor="0.2", linestyle="--", linewidth=0.8))
    whole.set_ylabel("sheet y (cortex mm)")
    halo = [withStroke(linewidth=2.2, foreground="white")]
    prefix, labels = map_labels(ids)
    fontsize = 7 * min(1.0, 3 / max(len(label) for label in labels))  # 7 pt fits 3 characters in a ring
    for electrode, label, (x, y) in zip(ids, labels, points):
        zoom.text(x, y, label, fontsize=fontsize, ha="center", va="center", path_effects=halo,
                  **ELECTRODE_ID_STYLES[kinds[electrode]])
    zoom.set_xlim(low[0], high[0])
    zoom.set_ylim(low[1], high[1])
    draw_pedestal(pedestal, array_layout, kinds, fontsize)

    def ring_handle(colour, width=0.8, size=8):
        return Line2D([], [], marker="o", linestyle="none", markerfacecolor="none", markeredgecolor=colour,
                      markeredgewidth=width, markersize=size, fillstyle="none")

    legend = [(ring_handle("k"), "recorded (id black: rehearsed; grey: not)")]
    if len(recorded) < len(ids):
        legend.append((ring_handle("0.6"), "in the layout, not recorded (dotted; grey italic id)"))
    if "broken" in kinds.values():
        legend.append((ring_handle("firebrick", 1.5), "broken (red id)"))
    if chosen:
        legend.append((ring_handle("limegreen", 1.8, 11), "chosen site (bold green id)"))
    fig.legend(*zip(*legend), loc="lower center", ncol=len(legend), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    whole.set_title(f"{chosen_model} IT sheet\narray at x = {pose.x_mm:.2f} mm, y = {pose.y_mm:.2f} mm, "
                    f"{pose.rotation_deg:.1f}°", fontsize=9)
    zoom.set_title(f"dashed box enlarged: all {len(ids)} electrodes, {len(recorded)} recorded"
                   + (f"\nids without their prefix '{prefix}'" if prefix else ""), fontsize=9)
    if values is not None:
        fig.colorbar(colours, ax=[whole, zoom], shrink=0.8, extend="both", label="face d′ of each IT unit")
    return figure_png(fig)


def sheet_caption(images, min_reliability: float, banks: bool) -> str:
    """The caption of :func:`sheet_figure`: the sheet coloured by face d′ only where the images allow one
    (:func:`_face_labels`), the pedestal panel's cells by bank only for a .cmp map (``banks``)."""
    return ("Left: the chosen model's IT sheet "
            + ("coloured by face selectivity (unit d′, faces vs other images of the mapping set)"
               if _face_labels(images) is not None else
               "in grey (the images have no 'domain' or 'category' labels with faces and other images, so no face "
               "selectivity)")
            + ", every electrode of the array at the registered pose — recorded ones in black circles, those of the "
            "layout without recordings in grey dotted circles, broken ones in red — and the chosen sites (green "
            "rings). Middle: the dashed box enlarged, every electrode labelled with its id: chosen sites in bold "
            "green, the other working electrodes in black, recorded electrodes not rehearsed (split-half reliability "
            f"under {min_reliability:g}) in grey, electrodes without recordings in grey italics, broken ones in red. "
            "Right: the array as on its map and pedestal (col from the left, row from the bottom, not rotated), the "
            "same ids" + (", cells coloured by Cerebus bank" if banks else "") + ".")


def truth_figure(plan, truth, summary, effect: str, label: str, working) -> bytes:
    """Planned against true ``effect`` (written ``label``) per working electrode (``working``: their ids, in the
    plan's order), the chosen sites marked, with the identity line (PNG)."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    alive = ~truth["dead"]
    true = truth[effect].reshape(len(alive), -1).mean(-1)
    chosen = np.isin([str(e) for e in working], [str(e) for e in summary["chosen_electrodes"]])
    fig, ax = plt.subplots(figsize=(4.2, 4.0))
    for shown, style in ((alive & ~chosen, {"color": "C0", "label": "other working electrodes"}),
                         (alive & chosen, {"color": "C3", "label": "chosen sites"})):
        ax.errorbar(plan["predicted"][shown], true[shown],
                    xerr=np.clip([plan["predicted"][shown] - plan["low"][shown],
                                  plan["high"][shown] - plan["predicted"][shown]],
                                 0, None),  # few candidates × poses: the pooled mean can lie outside the percentiles
                    fmt="o", ms=3, alpha=0.7, elinewidth=0.5, **style)
    x_limits, y_limits = ax.get_xlim(), ax.get_ylim()
    span = [max(x_limits[0], y_limits[0]), min(x_limits[1], y_limits[1])]
    ax.plot(span, span, "k--", lw=0.8, label="identity")
    ax.set(xlim=x_limits, ylim=y_limits)
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside: no point hidden
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # small effects have long tick labels: few keep them apart
    ax.set_xlabel(f"planned {label}")
    ax.set_ylabel(f"virtual subject's true {label}")
    ax.set_title(f"r = {summary['predicted_vs_true_r']:.2f} across {int(alive.sum())} working electrodes", fontsize=9)
    return figure_png(fig)


def consistency_radius_text(bootstraps: dict, names) -> str:
    """The radius (mm) within which a bootstrap refit counts an electrode as mapped consistently: once when every
    candidate's is the same, else each with its candidate's name."""
    radii = {name: bootstraps[name]["consistency_radius_mm"] for name in names}
    if len(set(radii.values())) == 1:
        return f"{next(iter(radii.values())):g} mm"
    return ", ".join(f"{radius:g} mm ({name})" for name, radius in radii.items())


def _selection_note(chosen_model: str, p_ranked_first: dict) -> list:
    """A sentence when resampling the electrodes often ranks another candidate first (chosen first in < 95 %)."""
    if len(p_ranked_first) < 2 or p_ranked_first[chosen_model] >= 0.95:
        return []
    return [Paragraph(
        f"The recordings do not settle the choice of model: {chosen_model} ranks first in "
        f"{math.floor(1000 * p_ranked_first[chosen_model]) / 10:g} % of the electrode resamples. The predicted effects and their "
        f"intervals average every candidate; what one model draws (the sheet map, designed stimuli) is "
        f"{chosen_model}'s.")]


def build_report(config, inputs, mapping, chosen_model, task, rehearsals, plan, sites, summary, truth, models,
                 record, out_dir) -> Report:
    working = mapping["working"]
    index_of = {e: i for i, e in enumerate(working)}
    names = list(rehearsals)
    plan_task = config.plan_task
    effect, label = plan_task.effect, plan_task.effect_label
    columns = ["rank", "electrode id", "array x, y (mm)"]
    if "ap_mm" in sites:
        columns += ["AP, ML (mm)"]
    columns += ["model x, y (model mm)", "sheet x, y (cortex mm)", f"predicted {label}",
                "95% interval: candidates × poses", "95% interval with model-to-subject error"]
    columns += [*plan_task.site_columns(), "status"]
    rows = []
    for record_row in sites.to_dict(orient="records"):
        i = index_of[record_row["electrode_id"]]
        row = [record_row["rank"], record_row["electrode_id"], (record_row["array_x_mm"], record_row["array_y_mm"])]
        if "ap_mm" in sites:
            row += [(record_row["ap_mm"], record_row["ml_mm"])]
        row += [(record_row["model_x_mm"], record_row["model_y_mm"]),
                (record_row["cortex_x_mm"], record_row["cortex_y_mm"]), record_row[f"predicted_{effect}"],
                _interval(record_row, f"predicted_{effect}"), _interval(record_row, f"predicted_{effect}_subject")]
        row += [*plan_task.site_cells(task, rehearsals[chosen_model], i), record_row["status"]]
        rows.append(tuple(row))
    protocol = sites.iloc[0]  # one stimulation protocol and one safety verdict for the whole plan
    columns_note = plan_task.site_columns_note()
    table = Table(tuple(columns), rows, digits=3, css_class="sites",
                  caption=f"Ranked sites (all working electrodes; 'chosen' = the plan's sites). Every site: "
                          f"{protocol['current_uA']:g} µA, {protocol['frequency_Hz']:g} Hz, "
                          f"{protocol['pulse_width_ms']:g} ms per phase, {protocol['charge_per_phase_nC']:g} nC per "
                          f"phase; safety {protocol['safety_verdict']}"
                          + (f". {columns_note}" if columns_note else ""))
    first = summary["model_selection"]["p_ranked_first"]
    selection_rows = [(*values, 100 * first[values[1]]) for values in
                      zip(*[mapping["selection"][k] for k in ("rank", "model", "median_r2", "chance_median_r2")])]
    registration_rows = []
    for name in names:
        reg, boot = mapping["registrations"][name], mapping["bootstraps"][name]
        registration_rows.append((name, reg["pose"]["x_mm"], reg["pose"]["y_mm"], reg["pose"]["rotation_deg"],
                                  reg["mean_correlation"], reg["chance_mean_correlation_p95"], boot["sd_x_mm"],
                                  boot["sd_y_mm"], boot["sd_rotation_deg"],
                                  float(np.mean(list(boot["electrode_consistency"].values())))))
    n_chosen = summary["n_sites"]
    overview = [Paragraph(
        f"{n_chosen} site(s) chosen out of {len(working)} working electrodes ({len(inputs.layout)} recorded of "
        f"{len(inputs.array_layout)} on the array). Stimulation: {config.stimulation['current_uA']:g} µA, "
        f"{config.stimulation['frequency_Hz']:g} Hz, "
        f"{config.stimulation['pulse_width_ms']:g} ms per phase ({config.stimulation['waveform']}); safety: "
        f"{'passed' if summary['safety']['passed'] else 'OVERRIDDEN — ' + str(summary['safety']['override_reason'])} "
        f"(Shannon k = {summary['safety']['shannon_k']:.2f}, limit {config.safety.max_shannon_k:g}). "
        f"Predicted {label}: mean over {len(names)} candidate model(s) at their fitted registration; the interval "
        f"spans 2.5–97.5 % over candidates × {config.n_boot + 1} registration poses (the fitted pose and "
        f"{config.n_boot} bootstrap poses; the models' and the "
        f"registration's uncertainty only); the second interval adds the model-to-subject error, "
        + (f"SD {summary['model_to_subject_sd']:.2g}, estimated from how far the candidates' effects lie from each "
           "other. " if summary["model_to_subject_sd"] is not None else
           "which needs at least 2 candidates (none here). ")
        + plan_task.describe(config.task_options, summary)),
        *detectability_blocks(summary),
        Image(sheet_figure(models[chosen_model], inputs.images, mapping, chosen_model, plan, working,
                           inputs.array_layout, config.selection.broken_electrodes),
              caption=sheet_caption(inputs.images, config.min_reliability, bool(inputs.array_layout.cerebus)),
              css_class="first-page")]
    if summary["left_out_warning"]:
        overview.append(Paragraph(f"Warning: {summary['left_out_warning']}.", css_class="warning"))
    if summary.get("sequence_warning"):
        overview.append(Paragraph(f"Warning: {summary['sequence_warning']}.", css_class="warning"))
    overview += plan_task.overview_blocks(rehearsals, plan, working, chosen_model)
    sections = [Section("Plan", overview), Section("Ranked sites", [table])]
    sections.append(Section("Model selection and registration", [
        Table(("rank", "model", "median CV ridge R²", "chance median R²", "ranked first (% of resamples)"),
              selection_rows,
              caption=f"Model selection: {config.n_folds}-fold cross-validated ridge predictivity of the working "
                      "electrodes (chance: features shuffled across images); ranked first: how often the model has "
                      f"the highest median R² over {summary['model_selection']['n_boot']:,} resamples of the "
                      f"electrodes (chance {100 / len(names):.0f} %)"),
        *_selection_note(chosen_model, first),
        Table(("model", "x (cortex mm)", "y (cortex mm)", "rotation (°)", "mean electrode r", "chance r (95th pct)",
               "bootstrap SD x (mm)", "SD y (mm)", "SD rotation (°)", "electrode consistency"), registration_rows,
              caption="Registration quality and stability (bootstrap over images). Mean electrode r: the Pearson r "
                      "across images of each electrode's recorded responses with the model's at its mapped point, "
                      "averaged over electrodes (chance: its 95th percentile over the poses of the coarse search); "
                      "electrode consistency: the mean fraction of bootstrap refits that map an electrode within "
                      + consistency_radius_text(mapping["bootstraps"], names)
                      + " of its fitted point. Sheet lengths are cortex mm: "
                      + "; ".join(f"{name} {scale['cortex_mm_per_model_mm']:g} cortex mm per model mm"
                                  + (" (overridden)" if scale["scale_overridden"] else "")
                                  for name, scale in summary["cortex_scale"].items()))]))
    sections[-1].blocks += plan_task.method_blocks(config.task_options, summary)
    if truth is not None:
        sections.append(Section("Validation on the virtual subject", [
            Paragraph(f"The subject's true {label}: the same "
                      + plan_task.stimuli_noun
                      + ", its own frozen decoders, stimulation at each "
                      f"electrode's true position on its sheet. Pearson r across working electrodes = "
                      f"{summary['predicted_vs_true_r']:.3f} (chance 0); per candidate model: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in summary["predicted_vs_true_r_per_model"].items()) + ". "
                      + _coverage_text(summary, label) +
                      "The model was chosen by cross-validated predictivity of the recordings only (ridge R², as in "
                      "Mehrer et al. 2025), never by the truth: these validation numbers are a check, available only "
                      "on a virtual subject."),
            Image(truth_figure(plan, truth, summary, effect, label, working),
                  caption=f"Planned against true {label} per working electrode (horizontal bars: the 95 % interval "
                          "over candidates × poses).")]))
    if "percepts" in summary:
        sections.append(Section("Predicted percepts", percept_blocks(summary["percepts"], Path(out_dir))))
    sections.append(Section("Model and input checksums", [
        Listing(record["model_checksums"], caption="The candidate models' files (sha256)"),
        Listing(record["input_sha256"], caption="The files the plan read its inputs from (sha256): the recordings, "
                                                "their layout, image tables and images, or the subject's file")]))
    return Report(f"Stimulation plan: {config.name}", sections,
                  subtitle=config.description or "stimsim site plan", parameters=record["config"],
                  software=record["software"])


def percept_blocks(percepts: dict, out_dir: Path) -> list:
    """The percept view (plan table ``[percepts]``): the figure ``stimsim visualize`` drew for the best-ranked chosen
    site, and in words the P(face) both judges give its images, as in its summary.json."""
    from stimsim.percepts.visualize import PNG_FILE

    def scores(judge: dict) -> str:
        rising = " / ".join(format_value(v, 2) for v in judge["pface_face_site"])
        return (f"{rising} at the site, {format_value(judge['pface_control_site'], 2)} at the control site, "
                f"{format_value(judge['pface_scrambled'], 2)} scrambled, {format_value(judge['pface_unstimulated'], 2)} "
                "unstimulated")

    currents = ", ".join(f"{c:g}" for c in percepts["currents_uA"])
    own, independent = percepts["judges"]["own"], percepts["judges"]["independent"]
    text = (f"Images synthesised so that the unperturbed IT of {percepts['model']} matches its IT under stimulation "
            f"(feature inversion, stimsim.percepts) at electrode {percepts['electrode']}, the best-ranked chosen site, "
            f"at {currents} µA; the control site is electrode {percepts['control_electrode']}, the lowest-ranked "
            "working electrode; 'scrambled' gives the top current's per-unit changes to shuffled units. P(face) of "
            f"the synthesised images (mean over the {', '.join(percepts['summary_groups'])} images), by the model's own "
            f"face decoder: {scores(own)}; by an independent model's ({independent['model']}): {scores(independent)}. "
            f"Every file of the view is in {percepts['folder']}/ (percepts.nc, summary.json, config.json).")
    png = (out_dir / percepts["folder"] / PNG_FILE).read_bytes()
    return [Paragraph(text), Image(png, caption=f"Predicted percepts of stimulating electrode {percepts['electrode']} "
                                                 f"(rows: images; columns: original, unstimulated inversion, the site "
                                                 f"at rising currents, the control site, scrambled).")]


def _coverage_text(summary: dict, label: str) -> str:
    """How often the plan's two intervals held the subject's true effect, and the spread of both effects."""
    share = {name: "–" if value is None else f"{value:.0%}"
             for name, value in summary["interval_coverage_of_true"].items()}
    sd = {name: "–" if summary.get(name) is None else f"{summary[name]:.2g}"
          for name in ("predicted_effect_sd", "true_effect_sd")}
    return (f"The 95 % interval over candidates × poses held the true {label} at {share['interval']} of the "
            f"working electrodes, the interval with model-to-subject error at {share['interval_with_subject']} "
            f"(nominal 95 %); SD of the effects across them: predicted {sd['predicted_effect_sd']}, true "
            f"{sd['true_effect_sd']}. ")


def _interval(row: dict, name: str) -> str | None:
    """"[low, high]" of ``name``_low / ``name``_high in a sites.csv row; None (shown "–") where it is undefined."""
    low, high = row[f"{name}_low"], row[f"{name}_high"]
    return None if not (np.isfinite(low) and np.isfinite(high)) else f"[{low:.4f}, {high:.4f}]".replace("-", "−")


def detectability_blocks(summary: dict) -> list:
    """The power forecast in words for the report's first page, in a warning box when the sites cannot reach the
    target power at the planned trial count. The tests are on ΔAUC of P(high) over each site's steps, whatever the
    task's own effect."""
    power, needed = summary.get("power_at_planned_trials"), summary.get("trials_per_site_needed")
    if power is None:
        return []
    forecast, largest = summary["power_forecast"], needed["largest_simulated"]

    reached = sum(value is not None for value in needed["per_site"].values())
    target = forecast["target_power"]
    half_width = 1.96 * np.sqrt(target * (1 - target) / forecast["n_sessions"])
    edge = " (the largest count simulated)" if needed["across_sites"] == largest else ""
    fewest = min_sites_across(forecast["alpha"])  # the test across sites never reaches p < alpha with fewer sites
    across = (f"none across sites (fewer than {fewest} sites)" if len(needed["per_site"]) < fewest else
              f"{trials_text(needed['across_sites'], largest)}{edge} across sites")
    text = (f"Power at the planned {power['trials_per_site']:,} trials per site ([session] trials_per_site, half "
            f"sham): {power['across_sites']:.0%} across sites (one-sided Wilcoxon signed-rank of ΔAUC in the "
            f"planned direction; chance {forecast['alpha']:g}), {power['per_site_mean']:.0%} per site (mean; z test; "
            f"chance {forecast['alpha'] / 2:g}). Trials per site for {forecast['target_power']:.0%} power: "
            f"{across}, {trials_text(needed['per_site_median'], largest)} per site (median; "
            f"{reached} of {len(needed['per_site'])} sites reach it by {largest:,}). Forecast from {forecast['source']} "
            f"(an animal that lapses needs more), {forecast['n_sessions']} simulated sessions per trial count "
            f"(power ±{half_width:.0%} near {target:.0%}).")
    if summary.get("power_warning"):
        return [Paragraph(f"Warning: these sites cannot reach {forecast['target_power']:.0%} power at the planned "
                          f"trial count. {text}", css_class="warning")]
    return [Paragraph(text)]
