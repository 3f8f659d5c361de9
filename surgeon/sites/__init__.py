"""Where a mask acts. `protocol` is the one interface the engine calls and the registry of site kinds;
`nodes` (hook points split into heads, key/value heads, slices or the whole vector), `edges` (the model's
graph, EAP-IG/MIB names) and `features` (an SAE's features) are the kinds. Each kind registers itself when
its module is imported (kept out of this file so that `surgeon --help` stays free of torch)."""
