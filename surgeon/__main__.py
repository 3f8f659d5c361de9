from surgeon.cli.commands import console

console()
