from gpufrac.cli.app import main

main()
