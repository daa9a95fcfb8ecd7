import XCTest
@testable import MoEKernels
final class PlaceholderTests: XCTestCase { func testNothing() {} }
