"""DataFlex-RL's selection and reweighting configurations (seed 001, Table 1), one module each,
registered in trainer_node.grpo.update_seam's SELECTIONS / REWEIGHTINGS. Every module here is
imported when either registry is first used. Sources and our departures: docs/DATAFLEX.md.

    selection    difffilter  maxvar  gfpo  topk
    reweighting  ar  per  softmax  diffband
"""
