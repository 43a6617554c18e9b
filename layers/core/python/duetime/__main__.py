from duetime.cli import main

main()
