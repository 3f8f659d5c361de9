"""Circuit graphs: the model's computation as a networkx graph, functions over it, and exports."""
