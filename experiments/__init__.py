"""`python -m experiments <name>`: thin scripts that reproduce the papers' tables.

Each experiment module exposes ``DESCRIPTION`` (one line), ``add_arguments(parser)``
(optional, its own options) and ``run(args) -> Report``; the command line adds
``--out DIR``, ``--seed`` and ``--quick`` to every experiment and writes
``results.json``, ``results.md`` and figures through `experiments.report`.
"""

EXPERIMENTS = {
    "quickstart": "experiments.quickstart",
    "convergence": "experiments.convergence",
    "traced-convergence": "experiments.traced_convergence",
    "theory": "experiments.theory",
    "uci-regression": "experiments.uci_regression",
    "mbnn-polynomial": "experiments.mbnn_polynomial",
    "mbnn-uci": "experiments.mbnn_uci",
    "mbnn-ablation": "experiments.mbnn_ablation",
    "mbnn-cnn": "experiments.mbnn_cnn",
    "gaussian-classification": "experiments.gaussian_classification",
    "svtp": "experiments.svtp",
    "ensembles": "experiments.ensembles",
    "lowrank-toy": "experiments.lowrank_toy",
    "lowrank-pm25": "experiments.lowrank_pm25",
    "pm25-exact": "experiments.pm25_exact",
    "lowrank-mlp": "experiments.lowrank_mlp",
    "lowrank-bounds": "experiments.lowrank_bounds",
    "lowrank-transformer": "experiments.lowrank_transformer",
    "tanks-onestep": "experiments.tanks_onestep",
    "tanks-simulation": "experiments.tanks_simulation",
    "dataset-kernel": "experiments.dataset_kernel",
}
