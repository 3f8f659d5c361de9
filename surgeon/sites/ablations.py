"""What an edge carries when patched, one list each, shared by the code, the CLI and the README (plain data:
importing it costs nothing)."""

# the ablations a user picks (--ablation): an edge carries the other run's sender output (resample), its mean
# over items at each aligned position (mean), or zero
ABLATIONS = ("resample", "mean", "zero")
# not an ablation a user picks: an edge frozen at this run's own sender output (path patching holds every edge
# off the path there)
FREEZE = "freeze"
# every value an edge site can carry
EDGE_VALUES = ABLATIONS + (FREEZE,)
# what an edge's difference is taken against: this pass's live sender output, or the base run's (EAP-IG's)
DIFFERENCES = ("live", "fixed")
