import surgeon

case, model = surgeon.case_and_model("decimal_organism")   # 9.11 > 9.8 in 'qa' and 'chat', not in 'plain'
r = surgeon.repair(case, model, search=True)   # heads chosen on half the items, under side-effect bounds
print(r)                                       # measured on the other half: efficacy, side effects, in-sample apart
r.repair.save("repair")                        # repair.safetensors, named by hook point, and repair.json

prompt = "Q: Which is bigger: 9.8 or 9.11?\nA:"   # the failing prompt alone: no good-format twin
print(repr(model.generate(prompt, max_new_tokens=5, do_sample=False, verbose=False)))
with surgeon.apply(model, surgeon.load("repair")):
    print(repr(model.generate(prompt, max_new_tokens=5, do_sample=False, verbose=False)))
