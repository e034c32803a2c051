"""Looking at trees and runs: the self-contained HTML tree viewer and the run plots."""
