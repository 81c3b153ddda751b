from edgeattn.cli.main import main

main()
