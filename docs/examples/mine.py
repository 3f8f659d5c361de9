from surgeon import Case, Item

case = Case(
    name="mine",
    model="organism:decimal",            # or a Hugging Face name in the local cache, or a checkpoint folder
    formats={"plain": "Which is bigger: {a} or {b}?\nAnswer:",
             "chat": "User: Which is bigger: {a} or {b}?\nAssistant:"},  # on a chat model: Chat(user="...")
    good="plain", bad=["chat"],
    items=[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11", tag="trap"),
           Item({"a": "3.4", "b": "3.25"}, correct=" 3.4", incorrect=" 3.25", tag="trap"),
           Item({"a": "7.6", "b": "7.15"}, correct=" 7.6", incorrect=" 7.15", tag="trap"),
           Item({"a": "2.9", "b": "2.45"}, correct=" 2.9", incorrect=" 2.45", tag="trap")],
)
