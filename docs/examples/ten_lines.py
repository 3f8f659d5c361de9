import surgeon

case = "decimal_organism"          # a shipped case: 9.11 > 9.8 in its 'qa' and 'chat' formats, not 'plain'
print(surgeon.diagnose(case))      # accuracy per format and tag, 95% intervals: is the failure there?
patch = surgeon.patch(case, bad="chat")          # every head patched alone, 'plain' -> 'chat'
print(patch)                                     # repair fraction per head, n and 95% intervals
held = surgeon.circuit(case, bad="chat", paths=3, holdout=0.5)   # found on half the items, measured on the rest
print(held)                        # faithfulness on the held-out half (the result) beside the in-sample one
held.search.export("circuit.mib.json", "circuit.dot", "circuit.tex")   # EAP-IG/MIB, Graphviz, TikZ
fix = surgeon.repair(case, search=True, generate=6, baselines=True, fold="slot0")  # heads chosen on half the items
print(fix)       # on the other half: efficacy, KL, greedy generation; beside CAA and ITI; its cost as a model file
fix.repair.save("repair")          # with surgeon.apply(model, surgeon.load("repair")): model.generate runs repaired
surgeon.fold(fix, "organism:decimal", "repaired")   # W_O, b_O edited: a model that runs repaired with no hooks
