import dataclasses

import surgeon
from surgeon.organisms import decimal as organism

case, model = surgeon.case_and_model("decimal_organism")
case = dataclasses.replace(case, score="first_token")   # read at the answers' first differing token
fresh = [it for it in organism.held_out_items(256, 128, seed=11)   # the organism's test split, as the case's items
         if not (it.correct.startswith(it.incorrect) or it.incorrect.startswith(it.correct))]
print(f"{'heads':28} {'paired qa':>10} {'qa traps':>20} {'chat traps':>11} {'qa controls':>12} {'plain traps':>12} "
      f"{'KL plain':>9}")
for heads in ("L0H4,L0H6", "L0H2,L0H4,L0H5,L0H6,L1H2", "all"):
    r = surgeon.repair(case, model, heads=heads, eval_items=fresh)   # every case item is discovery here
    rate = {(x.measure, x.format, x.tag): x.repaired for x in r.held_out}
    kl = {x.where: x.kl for x in r.shifts}
    if heads.startswith("L0H4"):
        none = {(x.format, x.tag): x.unrepaired for x in r.held_out}
        print(f"{'none':28} {'-':>10} {none['qa', 'trap'].value:>19.1%} {none['chat', 'trap'].value:>11.1%} "
              f"{none['qa', 'control'].value:>12.1%} {none['plain', 'trap'].value:>12.1%} {0:>9.3f}")
    qa = rate["efficacy", "qa", "trap"]
    print(f"{heads:28} {rate['paired', 'qa', 'trap'].value:>10.1%} {qa.value:>7.1%} [{qa.lo:.1%}, {qa.hi:.1%}] "
          f"{rate['efficacy', 'chat', 'trap'].value:>11.1%} {rate['generalization', 'qa', 'control'].value:>12.1%} "
          f"{rate['specificity', 'plain', 'trap'].value:>12.1%} {kl['plain'].value:>9.3f}")
print(f"built on the case's {r.repair.built_on['n_items']} trap items; measured on {r.split.evaluated_on}: "
      f"{qa.n} traps and {rate['generalization', 'qa', 'control'].n} controls per format (95% Wilson interval)")
