from ratchet.bench.run import main

main()
