"""What a methods section cites: the papers and tools behind each method surgeon runs, as BibTeX, and each method's
name as papers write it (plain data: importing it costs nothing).

A methods paragraph marks citations as `[[key1;key2]]`; `render(text, "text")` writes them author-year
("(Syed et al., 2024)"), `render(text, "latex")` as `\\cite{key1,key2}`; `bibtex(keys)` gives the entries cited.
"""
from __future__ import annotations

import re

# key -> (author-year as the text cites it, the BibTeX entry)
REFERENCES: dict[str, tuple[str, str]] = {
    "nanda2022transformerlens": ("Nanda and Bloom, 2022", """@misc{nanda2022transformerlens,
  title = {TransformerLens},
  author = {Nanda, Neel and Bloom, Joseph},
  year = {2022},
  howpublished = {\\url{https://github.com/TransformerLensOrg/TransformerLens}}
}"""),
    "xiao2024streaming": ("Xiao et al., 2024", """@inproceedings{xiao2024streaming,
  title = {Efficient Streaming Language Models with Attention Sinks},
  author = {Xiao, Guangxuan and Tian, Yuandong and Chen, Beidi and Han, Song and Lewis, Mike},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2024},
  note = {arXiv:2309.17453}
}"""),
    "gu2025sink": ("Gu et al., 2025", """@inproceedings{gu2025sink,
  title = {When Attention Sink Emerges in Language Models: An Empirical View},
  author = {Gu, Xiangming and Pang, Tianyu and Du, Chao and Liu, Qian and Zhang, Fengzhuo and Du, Cunxiao and Wang, Ye and Lin, Min},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2025},
  note = {arXiv:2410.10781}
}"""),
    "sun2024massive": ("Sun et al., 2024", """@inproceedings{sun2024massive,
  title = {Massive Activations in Large Language Models},
  author = {Sun, Mingjie and Chen, Xinlei and Kolter, J. Zico and Liu, Zhuang},
  booktitle = {Conference on Language Modeling (COLM)},
  year = {2024},
  note = {arXiv:2402.17762}
}"""),
    "yu2024superweight": ("Yu et al., 2024", """@misc{yu2024superweight,
  title = {The Super Weight in Large Language Models},
  author = {Yu, Mengxia and Wang, De and Shan, Qi and Reed, Colorado and Wan, Alvin},
  year = {2024},
  note = {arXiv:2411.07191}
}"""),
    "jin2025massivevalues": ("Jin et al., 2025", """@inproceedings{jin2025massivevalues,
  title = {Massive Values in Self-Attention Modules are the Key to Contextual Knowledge Understanding},
  author = {Jin, Mingyu and Mei, Kai and Xu, Wujiang and Sun, Mingjie and Tang, Ruixiang and Du, Mengnan and Liu, Zirui and Zhang, Yongfeng},
  booktitle = {International Conference on Machine Learning (ICML)},
  year = {2025},
  note = {arXiv:2502.01563}
}"""),
    "bloom2024saelens": ("Bloom et al., 2024", """@misc{bloom2024saelens,
  title = {{SAELens}},
  author = {Bloom, Joseph and Tigges, Curt and Duong, Anthony and Chanin, David},
  year = {2024},
  howpublished = {\\url{https://github.com/jbloomAus/SAELens}}
}"""),
    "marks2024sparse": ("Marks et al., 2024", """@misc{marks2024sparse,
  title = {Sparse Feature Circuits: Discovering and Editing Interpretable Causal Graphs in Language Models},
  author = {Marks, Samuel and Rager, Can and Michaud, Eric J. and Belinkov, Yonatan and Bau, David and Mueller, Aaron},
  year = {2024},
  note = {arXiv:2403.19647}
}"""),
    "heimersheim2024patching": ("Heimersheim and Nanda, 2024", """@misc{heimersheim2024patching,
  title = {How to use and interpret activation patching},
  author = {Heimersheim, Stefan and Nanda, Neel},
  year = {2024},
  note = {arXiv:2404.15255}
}"""),
    "wang2023ioi": ("Wang et al., 2023", """@inproceedings{wang2023ioi,
  title = {Interpretability in the Wild: a Circuit for Indirect Object Identification in {GPT-2} small},
  author = {Wang, Kevin and Variengien, Alexandre and Conmy, Arthur and Shlegeris, Buck and Steinhardt, Jacob},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2023},
  note = {arXiv:2211.00593}
}"""),
    "goldowskydill2023path": ("Goldowsky-Dill et al., 2023", """@misc{goldowskydill2023path,
  title = {Localizing Model Behavior with Path Patching},
  author = {Goldowsky-Dill, Nicholas and MacLeod, Chris and Sato, Lucas and Arora, Aryaman},
  year = {2023},
  note = {arXiv:2304.05969}
}"""),
    "li2023iti": ("Li et al., 2023", """@inproceedings{li2023iti,
  title = {Inference-Time Intervention: Eliciting Truthful Answers from a Language Model},
  author = {Li, Kenneth and Patel, Oam and Vi{\\'e}gas, Fernanda and Pfister, Hanspeter and Wattenberg, Martin},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2023}
}"""),
    "turner2023actadd": ("Turner et al., 2023", """@article{turner2023actadd,
  title = {Steering Language Models With Activation Engineering},
  author = {Turner, Alexander Matt and Thiergart, Lisa and Leech, Gavin and Udell, David and Vazquez, Juan J. and
            Mini, Ulisse and MacDiarmid, Monte},
  year = {2023},
  note = {arXiv:2308.10248}
}"""),
    "sclar2024formatspread": ("Sclar et al., 2024", """@inproceedings{sclar2024formatspread,
  title = {Quantifying Language Models' Sensitivity to Spurious Features in Prompt Design or: How I learned to start
           worrying about prompt formatting},
  author = {Sclar, Melanie and Choi, Yejin and Tsvetkov, Yulia and Suhr, Alane},
  booktitle = {The Twelfth International Conference on Learning Representations (ICLR)},
  year = {2024}
}"""),
    "holm1979": ("Holm, 1979", """@article{holm1979,
  title = {A Simple Sequentially Rejective Multiple Test Procedure},
  author = {Holm, Sture},
  journal = {Scandinavian Journal of Statistics},
  volume = {6},
  number = {2},
  pages = {65--70},
  year = {1979}
}"""),
    "rimsky2024caa": ("Rimsky et al., 2024", """@inproceedings{rimsky2024caa,
  title = {Steering {Llama 2} via Contrastive Activation Addition},
  author = {Rimsky, Nina and Gabrieli, Nick and Schulz, Julian and Tong, Meg and Hubinger, Evan and Turner, Alexander},
  booktitle = {Proceedings of the 62nd Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2024}
}"""),
    "meng2022rome": ("Meng et al., 2022", """@inproceedings{meng2022rome,
  title = {Locating and Editing Factual Associations in {GPT}},
  author = {Meng, Kevin and Bau, David and Andonian, Alex and Belinkov, Yonatan},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2022}
}"""),
    "meng2023memit": ("Meng et al., 2023", """@inproceedings{meng2023memit,
  title = {Mass-Editing Memory in a Transformer},
  author = {Meng, Kevin and Sharma, Arnab Sen and Andonian, Alex and Belinkov, Yonatan and Bau, David},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2023}
}"""),
    "wang2024easyedit": ("Wang et al., 2024", """@inproceedings{wang2024easyedit,
  title = {{EasyEdit}: An Easy-to-use Knowledge Editing Framework for Large Language Models},
  author = {Wang, Peng and Zhang, Ningyu and Tian, Bozhong and Xi, Zekun and Yao, Yunzhi and others},
  booktitle = {Proceedings of the 62nd Annual Meeting of the Association for Computational Linguistics: System Demonstrations},
  year = {2024}
}"""),
    "sandoval2025even": ("Sandoval, 2025", """@misc{sandoval2025even,
  title = {Even Heads Fix Odd Errors},
  author = {Sandoval, Gustavo},
  year = {2025},
  note = {arXiv:2508.19414}
}"""),
    "syed2024eap": ("Syed et al., 2024", """@inproceedings{syed2024eap,
  title = {Attribution Patching Outperforms Automated Circuit Discovery},
  author = {Syed, Aaquib and Rager, Can and Conmy, Arthur},
  booktitle = {Proceedings of the 7th BlackboxNLP Workshop},
  year = {2024},
  note = {arXiv:2310.10348}
}"""),
    "hanna2024faith": ("Hanna et al., 2024", """@inproceedings{hanna2024faith,
  title = {Have Faith in Faithfulness: Going Beyond Circuit Overlap When Finding Model Mechanisms},
  author = {Hanna, Michael and Pezzelle, Sandro and Belinkov, Yonatan},
  booktitle = {Conference on Language Modeling (COLM)},
  year = {2024},
  note = {arXiv:2403.17806}
}"""),
    "mueller2025mib": ("Mueller et al., 2025", """@inproceedings{mueller2025mib,
  title = {{MIB}: A Mechanistic Interpretability Benchmark},
  author = {Mueller, Aaron and others},
  booktitle = {International Conference on Machine Learning (ICML)},
  year = {2025},
  note = {arXiv:2504.13151}
}"""),
    "conmy2023acdc": ("Conmy et al., 2023", """@inproceedings{conmy2023acdc,
  title = {Towards Automated Circuit Discovery for Mechanistic Interpretability},
  author = {Conmy, Arthur and Mavor-Parker, Augustine N. and Lynch, Aengus and Heimersheim, Stefan and
            Garriga-Alonso, Adri{\\`a}},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2023},
  note = {arXiv:2304.14997}
}"""),
    "miller2024autocircuit": ("Miller et al., 2024", """@inproceedings{miller2024autocircuit,
  title = {Transformer Circuit Faithfulness Metrics are not Robust},
  author = {Miller, Joseph and Chughtai, Bilal and Saunders, William},
  booktitle = {Conference on Language Modeling (COLM)},
  year = {2024},
  note = {arXiv:2407.08734}
}"""),
    "sundararajan2017ig": ("Sundararajan et al., 2017", """@inproceedings{sundararajan2017ig,
  title = {Axiomatic Attribution for Deep Networks},
  author = {Sundararajan, Mukund and Taly, Ankur and Yan, Qiqi},
  booktitle = {International Conference on Machine Learning (ICML)},
  year = {2017}
}"""),
    "wilson1927": ("Wilson, 1927", """@article{wilson1927,
  title = {Probable Inference, the Law of Succession, and Statistical Inference},
  author = {Wilson, Edwin B.},
  journal = {Journal of the American Statistical Association},
  volume = {22},
  number = {158},
  pages = {209--212},
  year = {1927}
}"""),
    "efron1979bootstrap": ("Efron, 1979", """@article{efron1979bootstrap,
  title = {Bootstrap Methods: Another Look at the Jackknife},
  author = {Efron, Bradley},
  journal = {The Annals of Statistics},
  volume = {7},
  number = {1},
  pages = {1--26},
  year = {1979}
}"""),
    "elhage2021framework": ("Elhage et al., 2021", """@misc{elhage2021framework,
  title = {A Mathematical Framework for Transformer Circuits},
  author = {Elhage, Nelson and Nanda, Neel and Olsson, Catherine and Henighan, Tom and Joseph, Nicholas and
            Mann, Ben and Askell, Amanda and Bai, Yuntao and Chen, Anna and Conerly, Tom and others},
  howpublished = {Transformer Circuits Thread},
  url = {https://transformer-circuits.pub/2021/framework/index.html},
  year = {2021}
}"""),
    "nostalgebraist2020lens": ("nostalgebraist, 2020", """@misc{nostalgebraist2020lens,
  title = {interpreting {GPT}: the logit lens},
  author = {nostalgebraist},
  howpublished = {LessWrong},
  url = {https://www.lesswrong.com/posts/AcKRB8wDpdaN6v6ru/interpreting-gpt-the-logit-lens},
  year = {2020}
}"""),
}

# an edge-scoring method (`surgeon.circuits.methods.METHODS`) as a paper names it, and what to cite for it
METHOD_NAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "eap": ("edge attribution patching (EAP)", ("syed2024eap",)),
    "eap-ig-inputs": ("EAP with integrated gradients over the input embeddings (EAP-IG-inputs)",
                      ("hanna2024faith", "sundararajan2017ig", "mueller2025mib")),
    "eap-ig-activations": ("EAP with integrated gradients over each sender's activations (EAP-IG-activations)",
                           ("hanna2024faith", "sundararajan2017ig", "mueller2025mib")),
    "eap-ig-masks": ("integrated gradients over the edge masks (auto-circuit's convention)",
                     ("miller2024autocircuit", "sundararajan2017ig")),
    "exact": ("exact edge patching (each edge patched alone)", ("conmy2023acdc",)),
}

_CITE = re.compile(r"\[\[([\w;]+)\]\]")


def cite(*keys: str) -> str:
    """A citation marker in a methods paragraph."""
    unknown = [k for k in keys if k not in REFERENCES]
    if unknown:
        raise KeyError(f"no reference {unknown[0]!r}")
    return f"[[{';'.join(keys)}]]"


def cited(text: str) -> list[str]:
    """The keys `text` cites, in order of first citation."""
    out: list[str] = []
    for m in _CITE.finditer(text):
        out += [k for k in m.group(1).split(";") if k not in out]
    return out


def tex_escape(s: str) -> str:
    """Text for LaTeX: its special characters written as LaTeX writes them."""
    table = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#", "%": r"\%",
             "_": r"\_", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\n": r"\textbackslash{}n",
             "|": r"\textbar{}", "<": r"\textless{}", ">": r"\textgreater{}"}
    return "".join(table.get(c, c) for c in s)


def render(text: str, how: str = "text") -> str:
    """A paragraph with its markers as author-year citations ("text"), or as LaTeX (escaped, `\\cite{...}`)."""
    if how == "text":
        return _CITE.sub(lambda m: "(" + "; ".join(REFERENCES[k][0] for k in m.group(1).split(";")) + ")", text)
    parts, last = [], 0
    for m in _CITE.finditer(text):
        parts.append(tex_escape(text[last:m.start()]))
        parts.append(r"~\cite{" + ",".join(m.group(1).split(";")) + "}")
        last = m.end()
    parts.append(tex_escape(text[last:]))
    return "".join(parts).replace(" ~\\cite", "~\\cite")


# a document without the url package still compiles the entries' \url{...} (set in typewriter type, unbroken)
URL_FALLBACK = '@preamble{ "\\providecommand{\\url}[1]{\\texttt{#1}}" }'


def bibtex(keys) -> str:
    """The BibTeX entries of `keys` (URLs as \\url{...}: main.tex loads the url package, which breaks them at the
    line's end; elsewhere a fallback in the file's preamble sets them as they are)."""
    return URL_FALLBACK + "\n\n" + "\n\n".join(REFERENCES[k][1] for k in keys) + "\n"
