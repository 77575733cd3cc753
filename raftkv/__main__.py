from raftkv.cli import main

main()
