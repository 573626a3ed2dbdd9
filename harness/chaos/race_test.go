//go:build race

package chaos

// raceEnabled: the tests run with -race, so the gateway binary is built with it too.
const raceEnabled = true
