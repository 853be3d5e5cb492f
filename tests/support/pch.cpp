// The translation unit apart_tests_pch compiles: its precompiled header is what every test target reuses
// (tests/CMakeLists.txt).
