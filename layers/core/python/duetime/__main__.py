from duetime.cli.main import main

main()
