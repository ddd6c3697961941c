"""MCMC samplers over network pytrees (samplers layer of ARCHITECTURE.md).

* `samplers.driver`: the generic BlackJAX HMC / NUTS driver for any log density over a pytree (many chains,
  optionally sharded; warm-up adaptation; pooled step; chunked ``lax.scan``; checkpoint / resume; progress;
  split R-hat, bulk / tail ESS; ArviZ export). Its host loop, checkpoints and diagnostics serve every family.
* `samplers.hmc`: the BlackJAX transitions and warm-up pieces the driver and the family samplers share.
* `samplers.mbnn` (masked BNNs; the target changes between trajectories, so its iteration is its own),
  `samplers.masks` (mask birth / death moves), `samplers.msgld` (masked SGLD).

Nothing is imported eagerly: ``import samplers`` stays cheap.
"""
