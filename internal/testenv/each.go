package testenv

import "sync"

// Each runs op(0) to op(n-1) on workers goroutines and returns each call's error by index:
// the bulk steps of the scale tests (many volumes created, staged, deleted at once).
func Each(n, workers int, op func(i int) error) []error {
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				errs[i] = op(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}
