import surgeon

case = "decimal_organism"          # a shipped case: 9.11 > 9.8 in its 'qa' and 'chat' formats, not 'plain'
print(surgeon.diagnose(case))      # accuracy per format and tag, 95% intervals: is the failure there?
patch = surgeon.patch(case, bad="chat")          # every head patched alone, 'plain' -> 'chat'
print(patch)                                     # repair fraction per head, n and 95% intervals
held = surgeon.circuit(case, bad="chat", paths=3, holdout=0.5)   # found on half the items, measured on the rest
print(held)                        # faithfulness on the held-out half (the result) beside the in-sample one
held.search.export("circuit.mib.json", "circuit.dot", "circuit.tex")   # EAP-IG/MIB, Graphviz, TikZ
fix = surgeon.repair(case, search=True)   # a repair needing the failing prompt alone: heads chosen on half the items
print(fix)                         # efficacy, side effects (KL) on the other half; the best paired subset beside it
fix.repair.save("repair")          # with surgeon.apply(model, surgeon.load("repair")): model.generate runs repaired
