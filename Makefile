# Thin wrapper: CMake is the one build description.  Targets by intent.
BUILD ?= build
JOBS  ?= 2

.PHONY: all test test-all bench asan fuzz clean

all:            ## release build: library, dsattn CLI, test runner
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

test: all       ## the quick suites (what CI runs)
	cd $(BUILD) && ctest --output-on-failure -L quick

test-all: all   ## every suite, slow ones included
	cd $(BUILD) && ctest --output-on-failure

bench: all      ## kernel and attention benchmarks on this machine
	$(BUILD)/dsattn bench

asan:           ## quick suites under AddressSanitizer + UBSan
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DDSATTN_SANITIZE=ON >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -L quick

fuzz:           ## libFuzzer targets (clang)
	CC=clang cmake -S . -B $(BUILD)-fuzz -DDSATTN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build $(BUILD)-fuzz -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
