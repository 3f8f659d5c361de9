import surgeon

scan = surgeon.scan("decimal_organism", write_case="found.py")  # 96 formats around one question: where does it fail?
print(scan)                        # held out: worst and best formats, the part that causes it, the minimal pair
case = "found.py"                  # the pair it wrote ('works', 'fails'), the organism and the case's items
print(surgeon.diagnose(case))      # accuracy per format and tag, 95% intervals: is the failure there?
patch = surgeon.patch(case)                      # every head patched alone, 'works' -> 'fails'
print(patch)                                     # repair fraction per head, n and 95% intervals
held = surgeon.circuit(case, paths=3, holdout=0.5)   # found on half the items, measured on the rest
print(held)                        # faithfulness on the held-out half (the result) beside the in-sample one
held.search.export("circuit.mib.json", "circuit.dot", "circuit.tex")   # EAP-IG/MIB, Graphviz, TikZ
fix = surgeon.repair(case, search=True, generate=6, baselines=True, fold="slot0")  # heads chosen on half the items
print(fix)       # on the other half: efficacy, KL, greedy generation; beside CAA and ITI; its cost as a model file
fix.repair.save("repair")          # with surgeon.apply(model, surgeon.load("repair")): model.generate runs repaired
surgeon.fold(fix, "organism:decimal", "repaired")   # W_O, b_O edited: a model that runs repaired with no hooks
