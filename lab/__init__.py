"""`tfkit lab`: a design claim about Transformers turned into paired, controlled runs and a verdict.

A claim is a YAML spec (`recipes/lab/*.yaml`, or the user's own file): a base recipe, named variants as
lists of overrides, optional conversion and uptraining steps, probes, and the ordering the literature
expects. `spec` loads and checks it (`expect`: the expectations) and names the rows it makes, `plan` expands
it into runs, `engine` orchestrates: it checks everything before the first training (`downstream`: the
fine-tuning's recipe, files and labels) and trains and scores the runs (one tokenizer and one token cache per
lab, the same batches for every variant of a seed; `scoring` and `lengths` the columns; `progress` the lines
a running lab prints). `jobs` holds the prepared lab and where each job's output is, the floor below the
engine every other module reads it from. `probing` runs the probes (`probes`, `mechanisms`) that measure
what losses alone do not show, `verdict` turns paired differences into a verdict (read from the paired t
interval `stats` computes), `report` writes results.json, results.md and the plots, and `ladder` runs a
whole lab at several step counts.
"""
